//! The prefill kernel's tile (`wgsl/kernels/prefill.wgsl`): how many query rows, keys and
//! values one workgroup holds for a configuration, and the workgroup memory that takes.

use super::config::KernelConfig;
use super::module::KernelModule;
use super::preprocess::{Defines, Value};
use super::workgroup;
use crate::error::Result;

/// The prefill kernel's shape for one configuration ([`KernelConfig::prefill_tile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrefillTile {
    /// Floats of a query row scored against K's codes: D (padded to a multiple of 32), or a
    /// rotated K's padded `n_codes` (`PQA`).
    pub query_codes: u32,
    /// Floats of a query row in the tile: `query_codes`, plus D for QJL's `S q` (`PQW`).
    pub query_width: u32,
    /// Query rows of each of the [`PREFILL_ROW_GROUPS`] row groups (`PRB`, at most 4: a
    /// vec4 of weights per key); 0 where one row would not fit.
    pub rows_per_group: u32,
    /// Output vec4s per row each invocation of a row group accumulates (`PVU`).
    pub value_columns: u32,
    /// V rows decoded into the K/V tile at a time (`PVK`).
    pub value_keys: u32,
    /// K vec4s each invocation loads per pass (`PLK`), a pass ahead of its products.
    pub k_loads: u32,
    /// V slots (8 values of a row) each invocation loads per batch of `value_keys` rows
    /// (`PLV`), a batch ahead of its products.
    pub v_loads: u32,
}

/// Row groups of a prefill workgroup (`PTR`): its 128 invocations are 8 row groups of
/// [`PREFILL_LANES`] lanes, each lane scoring 4 keys of a 64-key tile against its group's
/// rows and accumulating a quarter or less of their output columns.
pub(crate) const PREFILL_ROW_GROUPS: u32 = 8;

/// Lanes of a prefill row group (`PTK` in the WGSL).
pub(crate) const PREFILL_LANES: u32 = 16;

/// Keys each prefill lane scores per tile (`PKT`): tiles of 64 keys.
pub(crate) const PREFILL_KEYS_PER_LANE: u32 = 4;

/// Floats of the prefill kernel's query tile (16 KiB): rows × `PQW`.
pub(crate) const PREFILL_QUERY_FLOATS: u32 = 4096;

/// Bytes of the prefill kernel's K/V tile: 16 coordinates of 64 keys' K at a time (32 with
/// f16 products), then `PVK` decoded V rows at a time. With the query tile (16 KiB) and the
/// weights (8 KiB) the kernel stays within the 32 KiB of workgroup memory kvq asks of an
/// adapter.
pub(crate) const PREFILL_KV_BYTES: u32 = 4096;

/// Bytes of the K/V tile with f16 products: 8 KiB (64 coordinates a K pass, half the passes
/// and barriers of a 4 KiB tile), which the f16 query tile and weights leave room for.
pub(crate) const PREFILL_KV_BYTES_F16: u32 = 8192;

/// Products an f16 sum takes at most before it is added into f32: 8 K columns (32
/// coordinates, in two f16 lanes of 16) and 16 V rows.
pub(crate) const PREFILL_F16_SUM: u32 = 16;

/// The matrix prefill kernel's tile (`wgsl/kernels/prefill_matrix.wgsl`) for one
/// configuration ([`KernelConfig::matrix_tile`]): 4 subgroups, 2 or 1 × 2 fragments of scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatrixTile {
    /// Fragment size F (`MF`).
    pub fragment: u32,
    /// Query rows of a workgroup, 2 F or F (`MR`).
    pub rows: u32,
    /// Keys of a tile, 2 F (`MT`).
    pub keys: u32,
    /// K coordinates decoded into the tile at a time (`MKP`): a divisor of the query row.
    pub k_pass: u32,
    /// V values of a row decoded into the tile at a time (`MVB`): a divisor of the value row
    /// padded (`PVM`, the padding's values zeros) to a multiple of [`MatrixTile::v_unit`].
    pub v_block: u32,
    /// The padded value row (`PVM`).
    pub v_padded: u32,
}

impl MatrixTile {
    /// What a V block's width is a multiple of: 32, and 4 F / MRF, so that the 4 subgroups
    /// take whole output fragments of a block.
    fn v_unit(fragment: u32, rows: u32) -> u32 {
        (4 * fragment * fragment / rows).max(32)
    }
}

/// Widths a K pass or a V block of the matrix tile may take, widest first: each a multiple of
/// both fragment sizes and of 32 (so the per-invocation load counts come out whole).
const MATRIX_PASSES: [u32; 4] = [128, 96, 64, 32];

impl KernelConfig {
    /// The matrix prefill kernel's tile on units `m`, or `None` where that kernel does not
    /// serve this configuration: fragments other than 16 or 8, rows other than F or 2 F,
    /// products other than f16
    /// ([`crate::Precision::Fast`]), exact tokens (their own loop stays in the FP32 kernel), a
    /// head size that is no multiple of 32 (its K tile loads whole 32-value passes of the
    /// stored rows, with no zero padding past D), or query or value rows no pass width divides.
    pub(crate) fn matrix_tile_for(&self, m: crate::MatrixUnits) -> Option<MatrixTile> {
        if !m.has_kernels()
            || !self.half_products()
            || self.exact.any()
            || !self.head_dim.is_multiple_of(32)
        {
            return None;
        }
        let f = m.fragment;
        let unit = MatrixTile::v_unit(f, m.rows);
        let v_padded = self.partial_width().next_multiple_of(unit);
        let widest = |w: u32, unit: u32| {
            MATRIX_PASSES
                .into_iter()
                .find(|p| p.is_multiple_of(unit) && w.is_multiple_of(*p))
        };
        Some(MatrixTile {
            fragment: f,
            rows: m.rows,
            keys: 2 * f,
            k_pass: widest(self.prefill_tile().query_width, 32)?,
            v_block: widest(v_padded, unit)?,
            v_padded,
        })
    }

    /// The matrix prefill kernel's tile where this configuration has matrix units
    /// ([`KernelConfig::matrix`]) and the kernel serves it.
    pub(crate) fn matrix_tile(&self) -> Option<MatrixTile> {
        self.matrix.and_then(|m| self.matrix_tile_for(m))
    }

    /// The matrix prefill kernel's tile as WGSL constants; an error where it does not serve
    /// this configuration (a cache sets [`KernelConfig::matrix`] only where it does).
    pub(super) fn matrix_defines(&self, h: &mut Defines, m: crate::MatrixUnits) -> Result<()> {
        let t = self.matrix_tile_for(m).ok_or_else(|| {
            crate::error::KvqError::InvalidSpec(format!(
                "the matrix prefill kernel does not serve {} at head_dim {} with {:?} products and {:?}",
                crate::codec::KvCodecs { k: self.k, v: self.v }.name(),
                self.head_dim,
                self.precision,
                self.exact
            ))
        })?;
        let lanes = PREFILL_ROW_GROUPS * PREFILL_LANES;
        let (f, rows, keys) = (t.fragment, t.rows, t.keys);
        let pv = self.partial_width();
        let pvm = t.v_padded;
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        c("MF", f);
        c("MR", rows);
        c("MRF", rows / f);
        c("MSK", 2 * f / rows);
        c("MT", keys);
        c("MKP", t.k_pass);
        c("MVB", t.v_block);
        c("PV", pv);
        c("PVM", pvm);
        // Rows of the f16 tiles padded by 8 values, of the f32 ones by 4.
        c("MQS", self.prefill_tile().query_width + 8);
        c("MKS", t.k_pass.max(t.v_block) + 8);
        c("MPS", keys + 8);
        c("MSS", keys + 4);
        c("MOS", pvm + 4);
        // Per invocation: K vec4s and V slots (8 values) it loads per pass or block; scores
        // it sums where the products are emulated; then lanes per softmax row, keys per lane,
        // and output fragments per subgroup of a V block.
        c("MLK", (keys * t.k_pass / 4).div_ceil(lanes));
        c("MLV", (keys * t.v_block / 8).div_ceil(lanes));
        c("ME", rows * keys / lanes);
        c("ML", lanes / rows);
        c("MKL", keys / (lanes / rows));
        c("MOF", (rows / f) * (t.v_block / f) / 4);
        Ok(())
    }

    /// Values of the prefill kernel's K/V tile (`PKV`): [`PREFILL_KV_BYTES`] of f32, or of
    /// f16 with f16 products (twice as many: a K pass then covers 32 coordinates, whose
    /// products are summed in f16 16 at a time before they are added into f32).
    pub(super) fn prefill_kv_values(&self) -> u32 {
        // (A pass of the larger f16 tile covers 64 coordinates: it takes it where the query
        // rows are whole passes.)
        if !self.half_products() {
            PREFILL_KV_BYTES / 4
        } else if self.prefill_query_width().0.is_multiple_of(64) {
            PREFILL_KV_BYTES_F16 / 2
        } else {
            PREFILL_KV_BYTES / 2
        }
    }

    /// Floats of a query row scored against K's codes and of a query row in the tile
    /// ([`PrefillTile::query_codes`], [`PrefillTile::query_width`]).
    fn prefill_query_width(&self) -> (u32, u32) {
        let d = self.head_dim;
        // (A row is whole K passes, of 16 or 32 coordinates: a head size that is no multiple
        // of 32 is padded with zeros.)
        let codes = if self.k.kind.is_rotated() {
            self.rot_width()
        } else {
            d.next_multiple_of(32)
        };
        (codes + if self.k.qjl { d } else { 0 }, codes)
    }

    /// The prefill kernel's tile for this configuration ([`PrefillTile`]).
    pub(crate) fn prefill_tile(&self) -> PrefillTile {
        let d = self.head_dim;
        let (query_width, query_codes) = self.prefill_query_width();
        let rows_per_group = (PREFILL_QUERY_FLOATS / (PREFILL_ROW_GROUPS * query_width)).min(4);
        let pv4 = self.partial_width() / 4;
        // V rows of a sub-tile: a power of two (it divides the 64 keys of a tile) whose rows
        // fill at most the K/V tile.
        let fit = (self.prefill_kv_values() / 4 / pv4).max(1);
        // (f16 sums take at most 16 V rows, whose weights are up to 1 each: V values up to
        // 4,000 stay inside f16's range.)
        let fit = fit.min(if self.half_products() { 16 } else { 64 });
        let value_keys = 1 << fit.ilog2();
        let lanes = PREFILL_ROW_GROUPS * PREFILL_LANES;
        // A batch's V slots, 8 values each: the codes' (VC columns of VW values a row), or
        // the exact rows' (D values).
        let v_slots = value_keys * (self.v_columns() * self.v_width() / 8).max(d / 8);
        PrefillTile {
            query_codes,
            query_width,
            rows_per_group,
            value_columns: pv4.div_ceil(PREFILL_LANES),
            value_keys,
            k_loads: self.prefill_kv_values() / 4 / lanes,
            v_loads: v_slots.div_ceil(lanes),
        }
    }

    /// The prefill kernel's tile as WGSL constants (kernels/prefill.wgsl): a configuration
    /// it does not serve still assembles with one row per row group, and is never dispatched.
    pub(super) fn prefill_defines(&self, h: &mut Defines) {
        let t = self.prefill_tile();
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        c("PQA", t.query_codes);
        c("PQW", t.query_width);
        c("PRB", t.rows_per_group.max(1));
        c("PBR", PREFILL_ROW_GROUPS * t.rows_per_group.max(1));
        c("PVU", t.value_columns);
        c("PVK", t.value_keys);
        c("PKV", self.prefill_kv_values());
        c("PTR", PREFILL_ROW_GROUPS);
        c("PTK", PREFILL_LANES);
        c("PKT", PREFILL_KEYS_PER_LANE);
        c("PLK", t.k_loads);
        c("PLV", t.v_loads);
        c("PF16_SUM", PREFILL_F16_SUM);
    }

    /// Query rows of one prefill workgroup (the matrix kernel's where [`KernelConfig::matrix`]
    /// is set), or `None` where the prefill kernel does not serve this cache: a query row too
    /// wide for one row per row group (a QJL K beside a rotor side at head_dim 256).
    pub(crate) fn prefill_rows(&self) -> Option<u32> {
        if let Some(m) = self.matrix_tile() {
            return Some(m.rows);
        }
        let t = self.prefill_tile();
        (t.rows_per_group > 0).then_some(PREFILL_ROW_GROUPS * t.rows_per_group)
    }

    /// Workgroup memory of the chunk module's `prefill` kernel, in bytes as WebGPU counts it.
    pub(crate) fn prefill_workgroup_bytes(&self) -> Result<u32> {
        let src = self.module_source(KernelModule::Chunk)?;
        Ok(workgroup::workgroup_bytes(&src, "prefill")?.webgpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::config::tests::cfg;
    use crate::spec::Precision;

    /// Every kind of K tile and V row the prefill kernels decode: f16, int, rotated (per-vector
    /// and per-32 scales), QJL signs, a rotor beside QJL.
    const CODEC_KINDS: [&str; 10] = [
        "none",
        "q8_sym",
        "k_q4",
        "turbo3_sym",
        "k_iso3",
        "rotor3_sym",
        "iso4b_sym",
        "k_turbo3+qjl",
        "k=iso3b+qjl,v=rotor4",
        "k_rotor3+qjl",
    ];

    #[test]
    fn prefill_tiles_fit_the_workgroup_memory_kvq_asks_for_at_every_shape() {
        // The query tile takes up to 16 KiB, the K/V tile 4 KiB, the weights 8 KiB: with the
        // level tables and the exchange array every served shape stays within 32 KiB.
        for codecs in CODEC_KINDS {
            for (d, g, precision) in [32, 64, 96, 128, 256]
                .into_iter()
                .flat_map(|d| [(d, 1), (d, 8)])
                .flat_map(|(d, g)| [(d, g, Precision::Exact), (d, g, Precision::Fast)])
            {
                let mut c = cfg(codecs, d);
                c.gqa = g;
                c.precision = precision;
                let t = c.prefill_tile();
                assert!(t.query_width.is_multiple_of(32), "{codecs} d={d}");
                // A K pass's columns divide the query row's.
                let pass = c.prefill_kv_values() / (PREFILL_LANES * PREFILL_KEYS_PER_LANE);
                assert!(t.query_width.is_multiple_of(pass), "{codecs} d={d}");
                assert!(t.value_keys.is_power_of_two() && t.value_keys <= 64);
                // A pass's K vec4s are spread evenly over the invocations.
                let lanes = PREFILL_ROW_GROUPS * PREFILL_LANES;
                assert_eq!(
                    t.k_loads * lanes * 4,
                    c.prefill_kv_values(),
                    "{codecs} d={d}"
                );
                if precision == Precision::Fast {
                    // An f16 sum takes at most 16 products: 32 coordinates of K in two
                    // lanes, 16 V rows.
                    assert!(t.value_keys <= PREFILL_F16_SUM, "{codecs} d={d}");
                }
                match c.prefill_rows() {
                    Some(rows) => {
                        assert!(rows <= 32 && rows.is_multiple_of(PREFILL_ROW_GROUPS));
                        let b = c.prefill_workgroup_bytes().unwrap();
                        assert!(b <= 32 * 1024, "{codecs} d={d} g={g}: {b} bytes");
                    }
                    // Only QJL beside a rotor side at D 256 (its 288 padded codes and
                    // S q's 256 values a query row).
                    None => {
                        assert!(t.query_width > PREFILL_QUERY_FLOATS / PREFILL_ROW_GROUPS);
                        assert!(codecs.contains("qjl") && codecs.contains("rotor") && d == 256);
                    }
                }
            }
        }
    }

    #[test]
    fn matrix_kernels_assemble_and_validate_for_every_codec_kind() {
        // naga parses and validates the chunk module with the matrix prefill kernel (hardware
        // fragments of 16 and 8, and emulated), and its workgroup memory is what the tile says.
        for codecs in CODEC_KINDS {
            for (d, g) in [(64, 1), (96, 7), (128, 4), (256, 8)] {
                for (fragment, emulated, rows) in [
                    (16, false, 32),
                    (16, false, 16),
                    (8, false, 16),
                    (16, true, 32),
                    (16, true, 16),
                    (8, true, 8),
                ] {
                    let mut c = cfg(codecs, d);
                    c.gqa = g;
                    c.precision = Precision::Fast;
                    let units = crate::MatrixUnits {
                        fragment,
                        emulated,
                        rows,
                    };
                    c.matrix = Some(units);
                    let what = format!("{codecs} d={d} {units:?}");
                    let t = c
                        .matrix_tile()
                        .unwrap_or_else(|| panic!("{what}: not served"));
                    assert_eq!(c.prefill_rows(), Some(rows));
                    // Whole output fragments for each subgroup of a V block.
                    assert!(
                        (rows / fragment * t.v_block / fragment).is_multiple_of(4),
                        "{what}"
                    );
                    let b = c
                        .prefill_workgroup_bytes()
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let qw = c.prefill_tile().query_width;
                    let f16s = rows * (qw + 8)
                        + t.keys * (t.k_pass.max(t.v_block) + 8)
                        + rows * (t.keys + 8);
                    let f32s = (2 * fragment / rows) * rows * (t.keys + 4)
                        + rows * (t.v_padded + 4)
                        + PREFILL_ROW_GROUPS * PREFILL_LANES;
                    assert!(b >= 16 + 2 * f16s + 4 * f32s, "{what}: {b} bytes");
                    if rows == fragment && d == 128 && !codecs.contains("qjl") {
                        // One row fragment fits Apple's 32 KiB at head_dim 128.
                        assert!(b <= 32 * 1024, "{what}: {b} bytes");
                    }
                }
                // Exact products and exact tokens keep the FP32 kernel, and no kernel exists
                // for other fragments or rows.
                let mut fast = cfg(codecs, d);
                fast.precision = Precision::Fast;
                for (fragment, rows) in [(0, 0), (4, 8), (32, 32), (16, 48)] {
                    fast.matrix = Some(crate::MatrixUnits {
                        fragment,
                        emulated: true,
                        rows,
                    });
                    assert_eq!(fast.matrix_tile(), None);
                    assert!(fast.module_source(KernelModule::Chunk).is_err());
                }
                let mut c = cfg(codecs, d);
                c.matrix = Some(crate::MatrixUnits::new(16, true));
                assert_eq!(c.matrix_tile(), None);
            }
        }
    }
}
