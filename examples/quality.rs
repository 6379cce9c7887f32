//! Codec quality table from the CPU reference codecs.
//!
//! ```text
//! cargo run --release --example quality -- --dim 128 --samples 1500 --csv quality.csv
//! ```
//!
//! Columns (all on the CPU reference, f64 math):
//! * `bits_per_value`: stored bits per value (row words * 32 / D).
//! * `d_mse_iso`: E||u − û||² over random unit vectors u (isotropic).
//! * `d_mse_outlier`: the same on an outlier fixture: Gaussian vectors with 4 fixed channels
//!   (out of 128; 4 * D / 128 in general) scaled by 20, normalized to unit length before
//!   encoding.
//! * `ip_bias`, `ip_dvar`: mean of (est − <q, x>) and D · E[(est − <q, x>)²] for random unit
//!   q and isotropic unit x; est = <q, x̂>, plus the QJL residual term for `+qjl` codecs.
//! * `attn_cos`: mean cosine similarity between single-query attention outputs over a
//!   quantized cache (K and V both with the codec; QJL on K only) and exact f64 attention
//!   over the unquantized cache. Fixture: 1024 Gaussian keys and values, each query = one
//!   random key + N(0, 0.5²) noise, logits scaled by 0.7 / sqrt(D) (peaked: the exact
//!   attention puts most of its weight on the source key; the mean top weight is printed).

use std::process::ExitCode;

use kvq::codec::rotation::{GaussianStream, SplitMix64};
use kvq::codec::{Codec, CodecRef};

const USAGE: &str = "usage: quality [--dim D] [--samples N] [--csv FILE]
  --dim D       head dimension (default 128)
  --samples N   Monte-Carlo vectors per metric (default 1500)
  --csv FILE    also write the table as CSV to FILE";

const CODECS: &[&str] = &[
    "none",
    "q8",
    "q4",
    "turbo1",
    "turbo2",
    "turbo3",
    "turbo4",
    "turbo3b",
    "rotor3",
    "rotor3b",
    "rotor4",
    "rotor4b",
    "iso3",
    "iso3b",
    "iso4",
    "iso4b",
    "turbo2+qjl",
    "turbo3+qjl",
    "iso3+qjl",
    "rotor3+qjl",
];

const KEYS: usize = 1024;
const QUERIES: usize = 64;
const TEMPERATURE: f64 = 0.7;

struct Args {
    dim: u32,
    samples: usize,
    csv: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dim: 128,
        samples: 1500,
        csv: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--dim" => args.dim = value("--dim")?.parse().map_err(|e| format!("--dim: {e}"))?,
            "--samples" => {
                args.samples = value("--samples")?
                    .parse()
                    .map_err(|e| format!("--samples: {e}"))?
            }
            "--csv" => args.csv = Some(value("--csv")?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    if args.samples == 0 {
        return Err("--samples must be at least 1".into());
    }
    Ok(args)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn normalized(v: Vec<f64>) -> Vec<f64> {
    let n = dot(&v, &v).sqrt();
    v.into_iter().map(|x| x / n).collect()
}

fn gaussian(g: &mut GaussianStream, d: usize) -> Vec<f64> {
    (0..d).map(|_| g.next_gaussian()).collect()
}

fn unit(g: &mut GaussianStream, d: usize) -> Vec<f64> {
    loop {
        let v = gaussian(g, d);
        if dot(&v, &v) > 0.0 {
            return normalized(v);
        }
    }
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// The fixture's outlier channels: 4 * D / 128 (at least 1) distinct channels.
fn outlier_channels(d: usize) -> Vec<usize> {
    let n = (4 * d / 128).max(1);
    let mut rng = SplitMix64::new(7);
    let mut ch = Vec::new();
    while ch.len() < n {
        let c = (rng.next_u64() % d as u64) as usize;
        if !ch.contains(&c) {
            ch.push(c);
        }
    }
    ch.sort_unstable();
    ch
}

/// The f32-rounded copy of `x` (what is handed to the encoder) as f64.
fn f32_round(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| v as f32 as f64).collect()
}

fn d_mse(r: &CodecRef, vectors: &[Vec<f64>]) -> f64 {
    let total: f64 = vectors
        .iter()
        .map(|u| {
            let uh = r.decode(&r.encode(&to_f32(u)));
            u.iter()
                .zip(&uh)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f64>()
        })
        .sum();
    total / vectors.len() as f64
}

/// `<q, x̂>` plus the QJL residual term when the codec has one.
fn estimate(r: &CodecRef, row: &[u32], xhat: &[f64], q: &[f64], sq: &[f64]) -> f64 {
    dot(q, xhat)
        + if r.codec().qjl {
            r.qjl_correction(row, sq)
        } else {
            0.0
        }
}

struct Row {
    name: String,
    bpv: f64,
    mse_iso: f64,
    mse_out: f64,
    ip_bias: f64,
    ip_dvar: f64,
    attn_cos: f64,
}

struct Fixtures {
    iso: Vec<Vec<f64>>,
    outlier: Vec<Vec<f64>>,
    ip_pairs: Vec<(Vec<f64>, Vec<f64>)>,
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
    queries: Vec<Vec<f64>>,
    exact: Vec<Vec<f64>>,
    top_weight: f64,
}

fn softmax_attend(logits: &[f64], values: &[Vec<f64>]) -> (Vec<f64>, f64) {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut out = vec![0.0; values[0].len()];
    for (wi, v) in w.iter().zip(values) {
        for (o, x) in out.iter_mut().zip(v) {
            *o += wi / z * x;
        }
    }
    (out, 1.0 / z)
}

fn fixtures(d: usize, samples: usize) -> Fixtures {
    let mut g = GaussianStream::new(0x00C0_FFEE);
    let iso = (0..samples).map(|_| unit(&mut g, d)).collect();
    let ch = outlier_channels(d);
    let outlier = (0..samples)
        .map(|_| {
            let mut v = gaussian(&mut g, d);
            for &c in &ch {
                v[c] *= 20.0;
            }
            normalized(v)
        })
        .collect();
    let ip_pairs = (0..samples)
        .map(|_| (unit(&mut g, d), unit(&mut g, d)))
        .collect();
    let keys: Vec<Vec<f64>> = (0..KEYS).map(|_| f32_round(&gaussian(&mut g, d))).collect();
    let values: Vec<Vec<f64>> = (0..KEYS).map(|_| f32_round(&gaussian(&mut g, d))).collect();
    let mut rng = SplitMix64::new(11);
    let queries: Vec<Vec<f64>> = (0..QUERIES)
        .map(|_| {
            let k = &keys[(rng.next_u64() % KEYS as u64) as usize];
            k.iter().map(|x| x + 0.5 * g.next_gaussian()).collect()
        })
        .collect();
    let scale = TEMPERATURE / (d as f64).sqrt();
    let mut top = 0.0;
    let exact = queries
        .iter()
        .map(|q| {
            let logits: Vec<f64> = keys.iter().map(|k| scale * dot(q, k)).collect();
            let (o, t) = softmax_attend(&logits, &values);
            top += t;
            o
        })
        .collect();
    Fixtures {
        iso,
        outlier,
        ip_pairs,
        keys,
        values,
        queries,
        exact,
        top_weight: top / QUERIES as f64,
    }
}

fn measure(codec: Codec, d: u32, f: &Fixtures) -> Result<Row, String> {
    let k = CodecRef::new(codec, d, 0x5EED_0001).map_err(|e| e.to_string())?;
    let v = CodecRef::new(codec.with_qjl(false), d, 0x5EED_0002).map_err(|e| e.to_string())?;
    let dd = d as usize;
    let mse_iso = d_mse(&k, &f.iso);
    let mse_out = d_mse(&k, &f.outlier);
    let (mut bias, mut sq_err) = (0.0, 0.0);
    for (x, q) in &f.ip_pairs {
        let row = k.encode(&to_f32(x));
        let err = estimate(&k, &row, &k.decode(&row), q, &k.qjl_project(q)) - dot(q, x);
        bias += err;
        sq_err += err * err;
    }
    let n = f.ip_pairs.len() as f64;
    let k_rows: Vec<Vec<u32>> = f.keys.iter().map(|x| k.encode(&to_f32(x))).collect();
    let k_hat: Vec<Vec<f64>> = k_rows.iter().map(|r| k.decode(r)).collect();
    let v_hat: Vec<Vec<f64>> = f
        .values
        .iter()
        .map(|x| v.decode(&v.encode(&to_f32(x))))
        .collect();
    let scale = TEMPERATURE / (dd as f64).sqrt();
    let mut cos = 0.0;
    for (q, exact) in f.queries.iter().zip(&f.exact) {
        let sq = k.qjl_project(q);
        let logits: Vec<f64> = k_rows
            .iter()
            .zip(&k_hat)
            .map(|(row, kh)| scale * estimate(&k, row, kh, q, &sq))
            .collect();
        let (o, _) = softmax_attend(&logits, &v_hat);
        cos += dot(&o, exact) / (dot(&o, &o) * dot(exact, exact)).sqrt();
    }
    Ok(Row {
        name: codec.name(),
        bpv: codec.bits_per_value(d),
        mse_iso,
        mse_out,
        ip_bias: bias / n,
        ip_dvar: dd as f64 * sq_err / n,
        attn_cos: cos / f.queries.len() as f64,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let d = args.dim;
    if let Err(e) = Codec::NONE.check_head_dim(d) {
        eprintln!("error: {e}\n{USAGE}");
        return ExitCode::from(2);
    }
    let f = fixtures(d as usize, args.samples);
    println!(
        "kvq codec quality, D = {d}, {} samples; outlier channels {:?} (x20); attention: {KEYS} keys, \
         {QUERIES} queries, mean top weight {:.3}",
        args.samples,
        outlier_channels(d as usize),
        f.top_weight
    );
    println!(
        "{:<12} {:>8} {:>10} {:>13} {:>9} {:>9} {:>9}",
        "codec", "bits/val", "d_mse_iso", "d_mse_outlier", "ip_bias", "ip_dvar", "attn_cos"
    );
    let mut csv =
        String::from("codec,bits_per_value,d_mse_iso,d_mse_outlier,ip_bias,ip_dvar,attn_cos\n");
    for name in CODECS {
        let codec = Codec::parse(name).expect("the table's codec names parse");
        match measure(codec, d, &f) {
            Ok(r) => {
                println!(
                    "{:<12} {:>8.3} {:>10.5} {:>13.5} {:>+9.5} {:>9.4} {:>9.6}",
                    r.name, r.bpv, r.mse_iso, r.mse_out, r.ip_bias, r.ip_dvar, r.attn_cos
                );
                csv.push_str(&format!(
                    "{},{},{:.6},{:.6},{:.6},{:.6},{:.6}\n",
                    r.name, r.bpv, r.mse_iso, r.mse_out, r.ip_bias, r.ip_dvar, r.attn_cos
                ));
            }
            Err(e) => println!("{name:<12} skipped: {e}"),
        }
    }
    if let Some(path) = args.csv {
        if let Err(e) = std::fs::write(&path, csv) {
            eprintln!("error: cannot write {path}: {e}");
            return ExitCode::from(1);
        }
        println!("wrote {path}");
    }
    ExitCode::SUCCESS
}
