//! Poisoned workgroup memory: a check that no kernel reads workgroup memory it has not written.
//!
//! kvq compiles its kernels without wgpu's zero-initialization of workgroup memory (it runs
//! before every workgroup's first barrier, see [`crate::GpuContext::with_workgroup_poison`]).
//! That is only sound if every kernel writes each workgroup value before reading it. With
//! poisoning on, every entry point first fills the workgroup variables it uses with NaN (f32)
//! or 0xDEADBEEF (u32), so a kernel that read an unwritten value would give NaN or a wild
//! index, and the tests, which run poisoned, would see it.

use naga::{AddressSpace, ArraySize, Binding, BuiltIn, Handle, ScalarKind, Type, TypeInner};

use crate::error::{KvqError, Result};

/// f32 poison: a quiet NaN with a recognisable payload.
const NAN_BITS: &str = "0x7fc0deadu";
/// u32 poison: far past any index of any kvq array or buffer.
const U32_POISON: &str = "0xdeadbeefu";

fn err(what: String) -> KvqError {
    KvqError::Gpu(format!("poisoning workgroup memory: {what}"))
}

/// WGSL for the poison value of an f32, f16 or u32 scalar or vector (the element types of kvq's
/// workgroup variables), or None for other types.
fn poison_value(types: &naga::UniqueArena<Type>, ty: Handle<Type>) -> Option<String> {
    let (size, s) = match types[ty].inner {
        TypeInner::Scalar(s) => (None, s),
        TypeInner::Vector { size, scalar } => (Some(size as u32), scalar),
        _ => return None,
    };
    let (t, v) = match (s.kind, s.width) {
        (ScalarKind::Float, 4) => ("f32", format!("bitcast<f32>({NAN_BITS})")),
        (ScalarKind::Uint, 4) => ("u32", U32_POISON.to_string()),
        // (An f32 NaN converted: WGSL bitcasts to f16 only as pairs, which naga refuses.)
        (ScalarKind::Float, 2) => ("f16", format!("f16(bitcast<f32>({NAN_BITS}))")),
        _ => return None,
    };
    Some(match size {
        Some(n) => format!("vec{n}<{t}>({v})"),
        None => v,
    })
}

/// `src` with a prologue at the start of every entry point that fills each workgroup
/// variable the entry point uses (directly or through the functions it calls) with poison,
/// followed by a barrier. Every kvq entry point with more than one invocation takes
/// `local_invocation_index`; the prologue splits the stores among the invocations with it.
pub(crate) fn poison_workgroup_memory(src: &str) -> Result<String> {
    let (module, info) = super::workgroup::analyse(src).map_err(err)?;
    let mut out = src.to_string();
    for (i, ep) in module.entry_points.iter().enumerate() {
        let uses = info.get_entry_point(i);
        let threads: u32 = ep.workgroup_size.iter().product();
        let lid = ep
            .function
            .arguments
            .iter()
            .find(|a| a.binding == Some(Binding::BuiltIn(BuiltIn::LocalInvocationIndex)))
            .and_then(|a| a.name.clone());
        let lid = match (lid, threads) {
            (Some(l), _) => l,
            (None, 1) => "0u".to_string(),
            (None, _) => {
                return Err(err(format!(
                    "entry point {} has {threads} invocations but no local_invocation_index",
                    ep.name
                )));
            }
        };
        let mut body = String::new();
        for (h, var) in module.global_variables.iter() {
            if var.space != AddressSpace::WorkGroup || uses[h].is_empty() {
                continue;
            }
            let name = var
                .name
                .as_deref()
                .ok_or_else(|| err("unnamed variable".into()))?;
            let unsupported = || err(format!("workgroup variable {name} has an unsupported type"));
            // A struct's members one by one (the matrix kernels' f16 tiles behind an aligning
            // vec4), else the variable itself.
            let parts: Vec<(String, Handle<Type>)> = match &module.types[var.ty].inner {
                TypeInner::Struct { members, .. } => members
                    .iter()
                    .map(|m| {
                        let member = m.name.as_deref().ok_or_else(unsupported)?;
                        Ok((format!("{name}.{member}"), m.ty))
                    })
                    .collect::<Result<_>>()?,
                _ => vec![(name.to_string(), var.ty)],
            };
            for (place, ty) in parts {
                match module.types[ty].inner {
                    TypeInner::Array {
                        base,
                        size: ArraySize::Constant(n),
                        ..
                    } => {
                        let v = poison_value(&module.types, base).ok_or_else(unsupported)?;
                        body += &format!(
                            "    for (var kvq_i = {lid}; kvq_i < {n}u; kvq_i += {threads}u) {{ {place}[kvq_i] = {v}; }}\n"
                        );
                    }
                    _ => {
                        let v = poison_value(&module.types, ty).ok_or_else(unsupported)?;
                        body += &format!("    if {lid} == 0u {{ {place} = {v}; }}\n");
                    }
                }
            }
        }
        if body.is_empty() {
            continue;
        }
        let at = out
            .find(&format!("fn {}(", ep.name))
            .and_then(|f| out[f..].find('{').map(|b| f + b + 1))
            .ok_or_else(|| err(format!("entry point {} not found in the source", ep.name)))?;
        out.insert_str(at, &format!("\n{body}    workgroupBarrier();\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisons_only_what_each_entry_point_uses() {
        let src = "var<workgroup> a: array<vec4<f32>, 8>;\n\
                   var<workgroup> b: u32;\n\
                   var<workgroup> c: array<f32, 3>;\n\
                   fn touch_a(i: u32) { a[i] = vec4<f32>(1.0); }\n\
                   @compute @workgroup_size(4)\n\
                   fn one(@builtin(local_invocation_index) lid: u32) { touch_a(lid); b = lid; }\n\
                   @compute @workgroup_size(1)\n\
                   fn two() { c[0] = 1.0; }\n";
        let p = poison_workgroup_memory(src).unwrap();
        let one = &p[p.find("fn one(").unwrap()..p.find("fn two(").unwrap()];
        assert!(one.contains(
            "kvq_i < 8u; kvq_i += 4u) { a[kvq_i] = vec4<f32>(bitcast<f32>(0x7fc0deadu)); }"
        ));
        assert!(one.contains("if lid == 0u { b = 0xdeadbeefu; }"));
        assert!(!one.contains("c[kvq_i]"));
        let two = &p[p.find("fn two(").unwrap()..];
        assert!(two.contains("for (var kvq_i = 0u; kvq_i < 3u; kvq_i += 1u) { c[kvq_i]"));
        assert!(!two.contains("a[kvq_i]"));
        naga::front::wgsl::parse_str(&p).unwrap();
    }
}
