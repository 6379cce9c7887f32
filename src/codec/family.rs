//! The codec families as one table: every fact about a family that names, validation, row
//! layout and the GPU kernels depend on. `docs/adding-a-codec.md` says what a new family
//! needs besides its entry here.

use super::rotation;

/// Family of a codec: how a head vector is turned into codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodecKind {
    /// Plain f16 storage (no quantization).
    None,
    /// Symmetric integer codes with one f16 scale per 32 values (ggml q8_0 / q4_0 style).
    Sym,
    /// TurboQuant-MSE: randomized Hadamard rotation + Lloyd–Max codes.
    Turbo,
    /// RotorQuant: a Cl(3,0) rotor per group of 3 coordinates + Lloyd–Max codes.
    Rotor,
    /// IsoQuant: a unit quaternion per group of 4 coordinates + Lloyd–Max codes.
    Iso,
}

impl CodecKind {
    /// Whether this family rotates and uses Lloyd–Max codes (turbo, rotor, iso).
    pub fn is_rotated(self) -> bool {
        self.family().rotated
    }

    pub(crate) fn prefix(self) -> &'static str {
        self.family().prefix
    }
}

/// One codec family's facts.
pub(crate) struct Family {
    /// The family.
    pub kind: CodecKind,
    /// Its name prefix (`q` for sym: `q8`, `q4`; `none` is the whole name).
    pub prefix: &'static str,
    /// Code widths it stores (a rotated family's 0 bits, QJL only, is for quality studies
    /// and has no GPU kernels).
    pub bits: &'static [u8],
    /// Whether it rotates and uses Lloyd–Max codes (its rows are encoded by the whole
    /// workgroup, its V output is un-rotated once in the reduce).
    pub rotated: bool,
    /// A multiple head_dim must be, beyond kvq's multiple of 8, and why.
    pub head_dim_multiple: Option<(u32, &'static str)>,
    /// Codes per stored row of `head_dim` values.
    pub n_codes: fn(u32) -> u32,
    /// The WGSL constant naming its `K_KIND` / `V_KIND` number (its index in [`FAMILIES`]).
    pub wgsl_kind: &'static str,
    /// f32 rotation coefficients the kernels read at `head_dim` (0: no rotation).
    pub coefficient_count: fn(u32) -> u32,
    /// Those coefficients for a seed, exactly the CPU reference's values: a rotor's matrices
    /// and an iso's quaternions one coefficient of every group before the next, so that the
    /// kernels' invocations, one per group, read consecutive words
    /// (wgsl/shared/rotate.wgsl, `group_matrix`).
    pub coefficients: fn(u64, usize) -> Vec<f32>,
}

/// Every family, in the order of their kernel numbers.
pub(crate) const FAMILIES: [Family; 5] = [
    Family {
        kind: CodecKind::None,
        prefix: "none",
        bits: &[16],
        rotated: false,
        head_dim_multiple: None,
        n_codes: |d| d,
        wgsl_kind: "KIND_NONE",
        coefficient_count: |_| 0,
        coefficients: |_, _| Vec::new(),
    },
    Family {
        kind: CodecKind::Sym,
        prefix: "q",
        bits: &[8, 4],
        rotated: false,
        head_dim_multiple: Some((
            32,
            "sym codecs need a multiple of 32 (one scale per 32 values)",
        )),
        n_codes: |d| d,
        wgsl_kind: "KIND_SYM",
        coefficient_count: |_| 0,
        coefficients: |_, _| Vec::new(),
    },
    Family {
        kind: CodecKind::Turbo,
        prefix: "turbo",
        bits: &[0, 1, 2, 3, 4],
        rotated: true,
        head_dim_multiple: Some((
            32,
            "turbo needs a multiple of 32 (Hadamard blocks of at least 32)",
        )),
        n_codes: |d| d,
        wgsl_kind: "KIND_TURBO",
        coefficient_count: |d| d,
        coefficients: rotation::turbo_signs,
    },
    Family {
        kind: CodecKind::Rotor,
        prefix: "rotor",
        bits: &[0, 1, 2, 3, 4],
        rotated: true,
        head_dim_multiple: None,
        // Whole groups of 3: the last group's missing coordinates are zeros.
        n_codes: |d| 3 * d.div_ceil(3),
        wgsl_kind: "KIND_ROTOR",
        coefficient_count: |d| 9 * d.div_ceil(3),
        coefficients: |seed, d| coefficient_major(&rotation::rotor_matrices(seed, d)),
    },
    Family {
        kind: CodecKind::Iso,
        prefix: "iso",
        bits: &[0, 1, 2, 3, 4],
        rotated: true,
        head_dim_multiple: Some((4, "iso needs a multiple of 4 (quaternion groups)")),
        n_codes: |d| d,
        wgsl_kind: "KIND_ISO",
        coefficient_count: |d| d,
        coefficients: |seed, d| coefficient_major(&rotation::iso_quaternions(seed, d)),
    },
];

impl CodecKind {
    /// This family's entry of [`FAMILIES`].
    pub(crate) fn family(self) -> &'static Family {
        &FAMILIES[self.id() as usize]
    }

    /// The family's number in the kernels (`K_KIND`, `V_KIND`): its index in [`FAMILIES`].
    pub(crate) fn id(self) -> u32 {
        self as u32
    }
}

/// Per-group coefficients laid out one coefficient of every group before the next.
fn coefficient_major<const N: usize>(groups: &[[f32; N]]) -> Vec<f32> {
    (0..N)
        .flat_map(|e| groups.iter().map(move |g| g[e]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::FAMILIES;

    #[test]
    fn the_table_is_in_kind_order_and_counts_its_coefficients() {
        for (i, f) in FAMILIES.iter().enumerate() {
            assert_eq!(f.kind.id() as usize, i, "{}", f.prefix);
            assert_eq!(f.kind.family().prefix, f.prefix);
            for d in [8u32, 64, 96, 100, 128, 256] {
                let n = (f.coefficients)(7, d as usize).len() as u32;
                assert_eq!(n, (f.coefficient_count)(d), "{} at d={d}", f.prefix);
            }
        }
    }
}
