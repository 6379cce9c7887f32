//! The cache's shape numbers the kernels read at run time: batch, capacity, window, layers,
//! heads, splits and the offsets that follow from them. They are fields of every segment's
//! uniform params (`Seg` in `wgsl/shared/common.wgsl`), not constants baked into the WGSL, so
//! caches that differ only in them assemble the same text and share one compiled pipeline
//! per context ([`crate::GpuContext::compiled_pipelines`]). What still changes the text (the
//! codecs, head_dim, the GQA ratio, the workgroup, the exact-token layout, the precision) is
//! what a kernel's compiler gains most from knowing: unrolled head loops and sized workgroup
//! arrays.

use bytemuck::{Pod, Zeroable};

use super::config::KernelConfig;
use super::preprocess::{Defines, Value};

/// The shape numbers as the kernels read them: the tail of each segment's uniform params, in
/// the order of `Seg`'s fields (`wgsl/shared/common.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub(crate) struct ShapeParams {
    /// Sequences (`NB`).
    pub batch: u32,
    /// Slots per sequence (`CAP`).
    pub capacity: u32,
    /// Positions attended, the last of them (`WIN`: the capacity without a window).
    pub window: u32,
    /// 1 for a sliding-window cache, whose slots are a ring (`RING`).
    pub ring: u32,
    /// Layers (`LAYERS`).
    pub layers: u32,
    /// KV heads (`KVH`).
    pub kv_heads: u32,
    /// Query heads (`QH`).
    pub q_heads: u32,
    /// Decode splits per storage segment (`NSPLIT`).
    pub splits: u32,
    /// Split slots over all segments (`SPLITS_TOTAL`).
    pub splits_total: u32,
    /// Partial slots per query row, the exact tokens' included (`PSLOTS`).
    pub partial_slots: u32,
    /// Fewest tokens a decode split takes (`MIN_CHUNK`).
    pub min_chunk: u32,
    /// Index of the codec constants in the lengths buffer (`CST`).
    pub constants: u32,
    /// Index of K's means in the lengths buffer (`KMU`).
    pub k_means: u32,
    /// Softmax scale (`SCALE`).
    pub scale: f32,
    /// Logit softcap, 0 for none (`SOFTCAP`).
    pub softcap: f32,
    /// Index of layer 0's first sink logit in the lengths buffer, [`NO_SINKS`] for none
    /// (`SINKS`).
    pub sinks: u32,
}

/// [`ShapeParams::sinks`] of a cache without sink logits (`NO_SINKS` in the WGSL).
pub(crate) const NO_SINKS: u32 = u32::MAX;

/// Each shape number's name in the WGSL and the expression that reads it from the segment's
/// params (`seg`, which every kernel module binds at group 0, binding 0).
const READS: [(&str, &str); 16] = [
    ("NB", "seg.batch"),
    ("CAP", "seg.capacity"),
    ("WIN", "seg.window"),
    ("RING", "(seg.ring != 0u)"),
    ("LAYERS", "seg.layers"),
    ("KVH", "seg.kv_heads"),
    ("QH", "seg.q_heads"),
    ("NSPLIT", "seg.splits"),
    ("SPLITS_TOTAL", "seg.splits_total"),
    ("PSLOTS", "seg.partial_slots"),
    ("MIN_CHUNK", "seg.min_chunk"),
    ("CST", "seg.constants"),
    ("KMU", "seg.k_means"),
    ("SCALE", "seg.scale"),
    ("SOFTCAP", "seg.softcap"),
    ("SINKS", "seg.sinks"),
];

/// The shape numbers that differ between the layers of a cache with a window per layer
/// ([`crate::CacheSpec::layer_windows`]): each layer's ring (`CAP`: its slots, `WIN`: its
/// window, `RING`: whether it has one) and, as a smaller ring takes fewer storage segments,
/// its split slots (`SPLITS_TOTAL`, `PSLOTS`). The layers share one text per kernel, so
/// these are never baked into such a cache's kernels ([`KernelConfig::bakes`]): every
/// layer's segments carry that layer's values in their params
/// ([`KernelConfig::layer_shape_params`]), and the kernels read them there.
pub(crate) const PER_LAYER: [&str; 5] = ["CAP", "WIN", "RING", "SPLITS_TOTAL", "PSLOTS"];

/// Whether every name of `names` is a shape number's (the tuning table's lists are checked
/// against this).
pub(crate) fn known(names: &[&str]) -> bool {
    names.iter().all(|n| READS.iter().any(|(r, _)| r == n))
}

/// For a measurement, the names to bake instead of a configuration's own
/// ([`KernelConfig::baked_shape`]): the comma-separated names in the environment variable
/// `KVQ_BAKE` (`all` for every one; set but empty for none), read once per process. Either
/// way the kernels compute the same results.
fn bake_override() -> Option<&'static [String]> {
    static NAMES: std::sync::OnceLock<Option<Vec<String>>> = std::sync::OnceLock::new();
    NAMES
        .get_or_init(|| match std::env::var("KVQ_BAKE") {
            Ok(v) if v.trim() == "all" => Some(READS.iter().map(|(n, _)| n.to_string()).collect()),
            Ok(v) => Some(
                v.split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect(),
            ),
            Err(_) => None,
        })
        .as_deref()
}

impl KernelConfig {
    /// That [`KernelConfig::baked_shape`] names shape numbers only.
    pub(super) fn check_baked_shape(&self) -> crate::error::Result<()> {
        if known(self.baked_shape) {
            return Ok(());
        }
        Err(crate::error::KvqError::InvalidSpec(format!(
            "kernel config: baked_shape {:?} names a number that is no shape number",
            self.baked_shape
        )))
    }

    /// The shape numbers of this configuration, as every segment's params hold them.
    pub(crate) fn shape_params(&self) -> ShapeParams {
        self.layer_shape_params(self.capacity, self.window, self.segments)
    }

    /// The shape numbers of a layer of its own `capacity`, `window` and `segments` (a layer
    /// with a window of its own, [`crate::CacheSpec::layer_windows`]): the rest as
    /// [`KernelConfig::shape_params`].
    pub(crate) fn layer_shape_params(
        &self,
        capacity: u32,
        window: Option<u32>,
        segments: u32,
    ) -> ShapeParams {
        let constants = 2 * self.layers * self.batch;
        let splits_total = (self.splits + 1) * segments;
        ShapeParams {
            batch: self.batch,
            capacity,
            window: window.unwrap_or(capacity),
            ring: window.is_some() as u32,
            layers: self.layers,
            kv_heads: self.kv_heads,
            q_heads: self.kv_heads * self.gqa,
            splits: self.splits,
            splits_total,
            partial_slots: splits_total + self.exact.any() as u32,
            min_chunk: self.min_chunk,
            constants,
            k_means: constants + self.constant_offsets().k_mean,
            scale: self.scale,
            softcap: self.softcap.unwrap_or(0.0),
            sinks: match self.sinks {
                true => constants + self.sinks_at(),
                false => NO_SINKS,
            },
        }
    }

    /// Whether shape number `name` (its WGSL name) is baked into this configuration's text
    /// as a constant, rather than read from each segment's params: the one statement of the
    /// rule. Baked where [`KernelConfig::baked_shape`] (or, for a measurement, the
    /// environment variable `KVQ_BAKE`) names it, except, where the layers' rings differ
    /// ([`KernelConfig::layer_shapes`]), the numbers that differ between layers: `CAP`,
    /// `WIN`, `RING`, `SPLITS_TOTAL` and `PSLOTS`, which every layer's params carry for that
    /// layer.
    pub fn bakes(&self, name: &str) -> bool {
        if self.layer_shapes && PER_LAYER.contains(&name) {
            return false;
        }
        match bake_override() {
            Some(names) => names.iter().any(|b| b == name),
            None => self.baked_shape.contains(&name),
        }
    }

    /// Adds the shape numbers to `h`: each read from the params at run time, or, where baked
    /// ([`KernelConfig::bakes`]), its value as a constant.
    pub(super) fn shape_defines(&self, h: &mut Defines) {
        let p = self.shape_params();
        let values = [
            Value::U32(p.batch),
            Value::U32(p.capacity),
            Value::U32(p.window),
            Value::Bool(p.ring != 0),
            Value::U32(p.layers),
            Value::U32(p.kv_heads),
            Value::U32(p.q_heads),
            Value::U32(p.splits),
            Value::U32(p.splits_total),
            Value::U32(p.partial_slots),
            Value::U32(p.min_chunk),
            Value::U32(p.constants),
            Value::U32(p.k_means),
            Value::F32(p.scale),
            Value::F32(p.softcap),
            Value::U32(p.sinks),
        ];
        for ((name, read), value) in READS.into_iter().zip(values) {
            if self.bakes(name) {
                h.constant(name, value);
            } else {
                h.constant(name, Value::Uniform(read));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::READS;
    use crate::kernels::config::tests::cfg;
    use crate::kernels::{KernelConfig, KernelModule};

    #[test]
    fn caches_of_other_sizes_assemble_the_same_text() {
        for codecs in ["none", "q4_sym", "turbo3_sym", "k_iso3", "k_turbo3+qjl"] {
            let a = cfg(codecs, 128);
            let mut b = a.clone();
            b.batch = 3;
            b.capacity = 4000;
            b.window = Some(1000);
            b.layers = 7;
            b.kv_heads = 5;
            b.splits = 3;
            b.segments = 2;
            b.min_chunk = 16;
            b.scale = 0.3;
            b.softcap = Some(30.0);
            b.sinks = true;
            for m in KernelModule::all() {
                let (x, y) = (a.module_source(m).unwrap(), b.module_source(m).unwrap());
                // (Unless KVQ_BAKE, a measurement aid, bakes some of them back.)
                assert!(x == y || super::bake_override().is_some(), "{codecs} {m:?}");
                // No shape number is left as a name the WGSL would not know.
                for (name, _) in READS {
                    let word = |l: &str| {
                        l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                            .any(|w| w == name)
                    };
                    let code = x.lines().map(|l| l.split("//").next().unwrap_or(""));
                    let baked = super::bake_override().is_some();
                    assert!(baked || !code.clone().any(word), "{codecs} {m:?}: {name}");
                }
            }
        }
    }

    #[test]
    fn the_params_are_what_the_wgsl_struct_reads() {
        // Seg's five segment fields, the sixteen shape numbers, three pads: 96 bytes.
        assert_eq!(std::mem::size_of::<super::ShapeParams>(), 16 * 4);
        let common = include_str!("../../wgsl/shared/common.wgsl");
        for (_, read) in READS {
            let field = read
                .trim_start_matches('(')
                .trim_start_matches("seg.")
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()
                .unwrap();
            assert!(common.contains(&format!("    {field}: ")), "{field}");
        }
    }

    #[test]
    fn baked_numbers_are_constants_and_the_tunings_name_only_shape_numbers() {
        for t in crate::tuning::MEASURED
            .iter()
            .chain([&crate::tuning::UNMEASURED])
        {
            assert!(super::known(t.baked_shape), "{}", t.name);
        }
        if super::bake_override().is_some() {
            return;
        }
        // Baked on NVIDIA: the numbers are constants in the text (caches of other sizes
        // assemble other texts), and the rest are still read from the params.
        let a = KernelConfig {
            baked_shape: crate::tuning::BAKED_ON_NVIDIA,
            ..cfg("q4_sym", 128)
        };
        let b = KernelConfig {
            capacity: 999,
            ..a.clone()
        };
        let src = a.module_source(KernelModule::Decode).unwrap();
        assert!(src.contains("const CAP: u32 = 256u;") && src.contains("seg.scale"));
        assert_ne!(src, b.module_source(KernelModule::Decode).unwrap());
    }

    #[test]
    fn a_window_per_layer_reads_each_layers_ring_from_its_params_even_where_baked() {
        if super::bake_override().is_some() {
            return;
        }
        // Where the layers' rings differ, the numbers that differ between layers are read
        // from the params on a tuning that bakes them, and only those: the others stay baked.
        let a = KernelConfig {
            baked_shape: crate::tuning::BAKED_ON_NVIDIA,
            layer_shapes: true,
            ..cfg("q4_sym", 128)
        };
        for name in super::PER_LAYER {
            assert!(crate::tuning::BAKED_ON_NVIDIA.contains(&name), "{name}");
            assert!(!a.bakes(name), "{name}");
        }
        assert!(a.bakes("NB") && a.bakes("NSPLIT") && !a.bakes("SCALE"));
        for m in KernelModule::all() {
            let src = a.module_source(m).unwrap();
            assert!(!src.contains("const CAP: u32") && !src.contains("const WIN: u32"));
            assert!(!src.contains("const PSLOTS: u32"), "{m:?}");
        }
        let src = a.module_source(KernelModule::Decode).unwrap();
        assert!(src.contains("seg.capacity") && src.contains("seg.window"));
        assert!(src.contains("const NB: u32 = 1u;"));
        // So caches whose rings differ share the text (its layers do: one compile each).
        let b = KernelConfig {
            capacity: 999,
            window: Some(100),
            segments: 3,
            ..a.clone()
        };
        for m in KernelModule::all() {
            assert_eq!(
                a.module_source(m).unwrap(),
                b.module_source(m).unwrap(),
                "{m:?}"
            );
        }
    }
}
