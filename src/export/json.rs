//! The replay plan and kernel manifest as JSON, written by hand: the format is small and kvq
//! stays free of a serializer.

use std::fmt::Write as _;

use super::plan::{Expected, PlanCheck, ReplayPlan};
use super::wgsl::{BindGroupLayoutDesc, ExportedKernel};

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_arr<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    let v: Vec<String> = items.into_iter().map(f).collect();
    format!("[{}]", v.join(","))
}

/// Standard base64 (with padding), as `Buffer.from(s, "base64")` and `atob` read it.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                o.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                o.push('=');
            }
        }
    }
    o
}

fn usage_names(u: wgpu::BufferUsages) -> Vec<&'static str> {
    use wgpu::BufferUsages as U;
    [
        (U::MAP_READ, "MAP_READ"),
        (U::MAP_WRITE, "MAP_WRITE"),
        (U::COPY_SRC, "COPY_SRC"),
        (U::COPY_DST, "COPY_DST"),
        (U::INDEX, "INDEX"),
        (U::VERTEX, "VERTEX"),
        (U::UNIFORM, "UNIFORM"),
        (U::STORAGE, "STORAGE"),
        (U::INDIRECT, "INDIRECT"),
        (U::QUERY_RESOLVE, "QUERY_RESOLVE"),
    ]
    .into_iter()
    .filter(|(f, _)| u.contains(*f))
    .map(|(_, n)| n)
    .collect()
}

fn layout_json(l: &BindGroupLayoutDesc) -> String {
    format!(
        "{{\"label\":{},\"entries\":{}}}",
        json_str(l.label),
        json_arr(&l.entries, |e| format!(
            "{{\"binding\":{},\"type\":{},\"role\":{}}}",
            e.binding,
            json_str(e.kind.webgpu_name()),
            json_str(e.role)
        ))
    )
}

/// One check of a plan: label, buffer and the expected contents in base64.
fn check_json(c: &PlanCheck) -> String {
    let e = match &c.expected {
        Expected::F32 {
            values,
            chunk,
            tolerance,
        } => format!(
            "\"kind\":\"f32_rel_err\",\"chunk\":{chunk},\"tolerance\":{tolerance:e},\"count\":{},\"expected_f64\":{}",
            values.len(),
            json_str(&base64(bytemuck::cast_slice(values)))
        ),
        Expected::U32(v) => format!(
            "\"kind\":\"u32_exact\",\"count\":{},\"expected_u32\":{}",
            v.len(),
            json_str(&base64(bytemuck::cast_slice(v)))
        ),
    };
    format!(
        "{{\"label\":{},\"buffer\":{},{e}}}",
        json_str(&c.label),
        c.buffer
    )
}

impl ReplayPlan {
    /// The plan as JSON (format `kvq-replay-plan/1`). Byte arrays (initial contents, expected
    /// f64 values as little-endian IEEE doubles, expected u32 values) are base64; `init` is
    /// null for an all-zero buffer. Usages are WebGPU `GPUBufferUsage` flag names.
    pub fn to_json(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"format\":\"kvq-replay-plan/1\",\"name\":{},\"summary\":{},\"target\":{},",
            json_str(&self.name),
            json_str(&self.summary),
            json_str(self.target.name())
        );
        let _ = write!(
            o,
            "\"features\":{},\"limits\":{{{}}},",
            json_arr(&self.features, |f| json_str(f)),
            self.limits
                .iter()
                .map(|(k, v)| format!("{}:{v}", json_str(k)))
                .collect::<Vec<_>>()
                .join(",")
        );
        let _ = write!(
            o,
            "\"buffers\":{},",
            json_arr(&self.buffers, |b| format!(
                "{{\"name\":{},\"size\":{},\"usage\":{},\"init\":{}}}",
                json_str(&b.name),
                b.size,
                json_arr(usage_names(b.usage), json_str),
                b.init
                    .as_ref()
                    .map_or("null".into(), |x| json_str(&base64(x)))
            ))
        );
        let _ = write!(
            o,
            "\"modules\":{},",
            json_arr(&self.modules, |m| format!(
                "{{\"name\":{},\"wgsl\":{}}}",
                json_str(&m.name),
                json_str(&m.wgsl)
            ))
        );
        let _ = write!(o, "\"layouts\":{},", json_arr(&self.layouts, layout_json));
        let _ = write!(
            o,
            "\"pipelines\":{},",
            json_arr(&self.pipelines, |p| format!(
                "{{\"module\":{},\"entry_point\":{},\"layouts\":[{},{}]}}",
                p.module,
                json_str(p.entry_point),
                p.layouts[0],
                p.layouts[1]
            ))
        );
        let _ = write!(
            o,
            "\"bind_groups\":{},",
            json_arr(&self.bind_groups, |g| format!(
                "{{\"layout\":{},\"buffers\":{}}}",
                g.layout,
                json_arr(&g.buffers, |b| b.to_string())
            ))
        );
        let g = &self.grid_shape;
        let _ = write!(
            o,
            "\"grid_shape\":{{\"batch\":{},\"q_heads\":{},\"kv_heads\":{},\"row_groups\":{},\"splits\":{},\"exact\":{}}},",
            g.batch, g.q_heads, g.kv_heads, g.row_groups, g.splits, g.exact
        );
        let _ = write!(
            o,
            "\"passes\":{},",
            json_arr(&self.passes, |p| format!(
                "{{\"label\":{},\"dispatches\":{}}}",
                json_str(&p.label),
                json_arr(&p.dispatches, |d| format!(
                    "{{\"pipeline\":{},\"bind_groups\":[{},{}],\"workgroups\":[{},{},{}],\"wide_groups\":{},\"queries\":{},\"query_groups\":{},\"row_tiles\":{},\"splits\":{}}}",
                    d.pipeline,
                    d.bind_groups[0],
                    d.bind_groups[1],
                    d.workgroups[0],
                    d.workgroups[1],
                    d.workgroups[2],
                    d.wide_groups,
                    d.queries,
                    d.query_groups,
                    d.row_tiles,
                    d.splits
                ))
            ))
        );
        let _ = write!(o, "\"checks\":{}}}", json_arr(&self.checks, check_json));
        o
    }
}

/// Every kernel module of `cfg` for `target` as a JSON manifest entry list (used by the
/// `export_wgsl` example): module name, file name the example writes it to, entry points
/// with dispatch rules, bind group layouts, features.
pub fn kernels_json(
    kernels: &[ExportedKernel],
    file_of: impl Fn(&ExportedKernel) -> String,
) -> String {
    json_arr(kernels, |k| {
        format!(
            "{{\"module\":{},\"file\":{},\"entry_points\":{},\"bind_group_layouts\":[{},{}],\"features\":{}}}",
            json_str(&k.module.name()),
            json_str(&file_of(k)),
            json_arr(&k.entry_points, |e| format!(
                "{{\"name\":{},\"grid\":{},\"when\":{}}}",
                json_str(e.entry),
                json_arr(&e.grid, |t| json_str(t.formula())),
                json_str(e.when)
            )),
            layout_json(&k.bind_group_layouts[0]),
            layout_json(&k.bind_group_layouts[1]),
            json_arr(&k.features, |f| json_str(f))
        )
    })
}

/// A JSON string literal of `s` (for manifests written next to plans).
pub fn json_string(s: &str) -> String {
    json_str(s)
}
