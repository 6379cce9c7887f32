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
    /// Floats of a query row scored against K's codes: D, or a rotated K's padded
    /// `n_codes` (`PQA`).
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

impl KernelConfig {
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
        let codes = if self.k.kind.is_rotated() {
            self.rot_width()
        } else {
            d
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

    /// Query rows of one prefill workgroup, or `None` where the prefill kernel does not
    /// serve this cache: a query row too wide for one row per row group (a QJL K beside a
    /// rotor side at head_dim 256).
    pub(crate) fn prefill_rows(&self) -> Option<u32> {
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

    #[test]
    fn prefill_tiles_fit_the_workgroup_memory_kvq_asks_for_at_every_shape() {
        // The query tile takes up to 16 KiB, the K/V tile 4 KiB, the weights 8 KiB: with the
        // level tables and the exchange array every served shape stays within 32 KiB.
        for codecs in [
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
        ] {
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
}
