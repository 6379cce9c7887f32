//! Codec and cache names, and the row layouts.

use super::*;

#[test]
fn codec_names_round_trip() {
    for c in all_codecs() {
        assert_eq!(Codec::parse(&c.name()).unwrap(), c);
    }
    assert_eq!(Codec::parse("turbo3").unwrap(), Codec::turbo(3));
    assert_eq!(
        Codec::parse("iso3b").unwrap(),
        Codec::iso(3).with_scale(ScaleMode::Block32)
    );
    assert_eq!(
        Codec::parse("rotor3+qjl").unwrap(),
        Codec::rotor(3).with_qjl(true)
    );
    for bad in [
        "",
        "q3",
        "turbo5",
        "turbo",
        "turbo33",
        "iso3bb",
        "none+qjl",
        "q8+qjl",
        "turbo0",
        "rotor3+QJL",
        "3",
    ] {
        assert!(
            matches!(Codec::parse(bad), Err(KvqError::UnknownCodec { .. })),
            "{bad}"
        );
    }
}

#[test]
fn cache_names_parse_and_round_trip() {
    let p = |s: &str| KvCodecs::parse(s).unwrap();
    assert_eq!(p("none"), KvCodecs::NONE);
    assert_eq!(
        p("k_iso3"),
        KvCodecs {
            k: Codec::iso(3),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("k_rotor4"),
        KvCodecs {
            k: Codec::rotor(4),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("k_turbo3+qjl"),
        KvCodecs {
            k: Codec::turbo(3).with_qjl(true),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("rotor3_sym"),
        KvCodecs {
            k: Codec::rotor(3),
            v: Codec::rotor(3)
        }
    );
    assert_eq!(
        p("turbo3+qjl_sym"),
        KvCodecs {
            k: Codec::turbo(3).with_qjl(true),
            v: Codec::turbo(3)
        }
    );
    assert_eq!(
        p("q8_sym"),
        KvCodecs {
            k: Codec::Q8,
            v: Codec::Q8
        }
    );
    assert_eq!(
        p("k=iso3, v=q8"),
        KvCodecs {
            k: Codec::iso(3),
            v: Codec::Q8
        }
    );
    assert_eq!(
        p("v=q4,k=turbo4"),
        KvCodecs {
            k: Codec::turbo(4),
            v: Codec::Q4
        }
    );
    for n in KvCodecs::valid_names().iter().chain(&KvCodecs::all_names()) {
        let kv = p(n);
        assert_eq!(p(&kv.name()), kv, "{n}");
        assert_eq!(&kv.name(), n);
        for d in DIMS {
            kv.check_head_dim(d).unwrap();
        }
    }
    let general = p("k=q4,v=iso3");
    assert_eq!(general.name(), "k=q4,v=iso3");
    assert_eq!(p("k=none,v=turbo2").name(), "k=none,v=turbo2");
    let all = KvCodecs::all_names();
    assert_eq!(all.len(), 20);
    assert!(all.contains(&"k_turbo3+qjl".to_string()) && all.contains(&"iso4_sym".to_string()));
    for bad in [
        "",
        "k_none",
        "none_sym",
        "iso3",
        "k_iso5",
        "q8sym",
        "k=iso3",
        "k=iso3,v=iso3,v=q8",
        "x=iso3,v=q8",
        "k_",
    ] {
        match KvCodecs::parse(bad) {
            Err(KvqError::UnknownCodec { name, valid, .. }) => {
                assert_eq!(name, bad);
                assert!(
                    valid.contains("k_iso3") && valid.contains("turbo3+qjl"),
                    "{valid}"
                );
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        KvCodecs::parse("k=iso3,v=iso3+qjl"),
        Err(KvqError::InvalidSpec(_))
    ));
}

#[test]
fn unknown_cache_names_say_what_was_probably_meant_in_a_short_message() {
    for (bad, hint) in [
        ("q8", "'q8_sym' (K and V) or 'k_q8' (K only)"),
        ("iso3", "'iso3_sym' (K and V) or 'k_iso3' (K only)"),
        ("turbo3+qjl", "'k_turbo3+qjl' (K only)"),
        ("k=q8", "both K and V"),
        ("k_iso5", ""),
    ] {
        let e = KvCodecs::parse(bad).unwrap_err();
        let msg = e.to_string();
        match e {
            KvqError::UnknownCodec { hint: h, .. } => {
                assert!(h.contains(hint), "{bad}: {h}");
                assert_eq!(h.is_empty(), hint.is_empty(), "{bad}: {h}");
            }
            other => panic!("{bad}: {other:?}"),
        }
        assert!(msg.len() < 500, "{bad}: {} characters: {msg}", msg.len());
    }
}

// ----------------------------------------------------------------------------- layouts

#[test]
fn layouts_at_128_match_the_contract() {
    let words = |n: &str| Codec::parse(n).unwrap().row_words(128);
    assert_eq!(words("none"), 64);
    assert_eq!(words("q8"), 34);
    assert_eq!(words("q4"), 18);
    assert_eq!(words("turbo3"), 13);
    assert_eq!(words("iso3"), 13);
    assert_eq!(words("rotor3"), 13);
    assert_eq!(words("iso3b"), 14);
    assert_eq!(words("rotor3b"), 15);
    assert_eq!(words("turbo3+qjl"), 18);
    assert_eq!(Codec::Q8.bits_per_value(128), 8.5);
    assert_eq!(Codec::Q4.bits_per_value(128), 4.5);
    assert_eq!(Codec::turbo(3).bits_per_value(128), 3.25);
    assert!(Codec::rotor(3).bits_per_value(128) <= 3.5);
    let r = Codec::rotor(3).layout(128).unwrap();
    assert_eq!(
        (r.n_codes, r.side_offset_bits, r.n_side, r.used_bits()),
        (129, 400, 1, 416)
    );
    let q = Codec::turbo(3).with_qjl(true).layout(128).unwrap();
    assert_eq!(q.qjl_offset_bits, Some(416));
    assert_eq!(
        (q.qjl_bits, q.qjl_norm_offset_bits, q.used_bits()),
        (128, 544, 560)
    );
    let s = Codec::Q8.layout(128).unwrap();
    assert_eq!(
        (
            s.n_codes,
            s.code_bits,
            s.side_offset_bits,
            s.n_side,
            s.side_block
        ),
        (128, 8, 1024, 4, 32)
    );
}

#[test]
fn layouts_at_every_dim() {
    for c in all_codecs() {
        for d in DIMS {
            let l = c
                .layout(d)
                .unwrap_or_else(|e| panic!("{} at {d}: {e}", c.name()));
            let n_codes = if c.kind == CodecKind::Rotor {
                3 * d.div_ceil(3)
            } else {
                d
            };
            assert_eq!(l.n_codes, n_codes);
            assert_eq!(l.code_bits, c.bits as u32);
            assert_eq!(
                l.side_offset_bits,
                (n_codes * l.code_bits).div_ceil(16) * 16
            );
            let n_side = match (c.kind, c.scale) {
                (CodecKind::None, _) => 0,
                (CodecKind::Sym, _) | (_, ScaleMode::Block32) => n_codes.div_ceil(32),
                _ => 1,
            };
            assert_eq!(l.n_side, n_side);
            let side_end = l.side_offset_bits + 16 * n_side;
            if c.qjl {
                let off = side_end.div_ceil(32) * 32;
                assert_eq!(l.qjl_offset_bits, Some(off));
                assert_eq!(l.qjl_bits, d);
                assert_eq!(l.qjl_norm_offset_bits, (off + d).div_ceil(16) * 16);
            } else {
                assert_eq!(l.qjl_offset_bits, None);
            }
            assert_eq!(l.words, l.used_bits().div_ceil(32));
            assert_eq!(c.row_words(d), l.words);
            assert_eq!(c.bits_per_value(d), l.words as f64 * 32.0 / d as f64);
        }
    }
}

#[test]
fn unsupported_dims_are_typed_errors() {
    let e = |c: Codec, d| matches!(c.layout(d), Err(KvqError::UnsupportedHeadDim { .. }));
    assert!(e(Codec::Q8, 40));
    assert!(e(Codec::turbo(3), 80));
    assert!(!e(Codec::iso(3), 40) && !e(Codec::rotor(3), 40));
    assert!(e(Codec::iso(3), 42) && e(Codec::NONE, 584) && e(Codec::rotor(3), 0));
    // MLA's widths: every family's rows hold them (turbo as Hadamard blocks 512 + 64).
    for c in [
        Codec::NONE,
        Codec::Q8,
        Codec::turbo(3),
        Codec::iso(3),
        Codec::rotor(3),
    ] {
        assert!(!e(c, 512) && !e(c, 576), "{}", c.name());
    }
    let bogus = Codec {
        kind: CodecKind::Sym,
        bits: 3,
        qjl: false,
        scale: ScaleMode::Block32,
    };
    assert!(matches!(bogus.layout(128), Err(KvqError::InvalidSpec(_))));
}
