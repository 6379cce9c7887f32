//! Writes kvq's kernels and replay plans for other WebGPU hosts.
//!
//! `cargo run --example export_wgsl -- DIR [--target browser|native] [--only SUBSTRING]`
//!
//! For every scenario of `shared/scenarios.rs` (every GPU codec for K and V, several
//! shapes, the separate and the fused step path) it writes
//! * `DIR/<scenario>/<module>.wgsl`: each kernel module's exact WGSL for the target;
//! * `DIR/<scenario>/plan.json`: the replay plan (buffers, pipelines, bind groups, dispatches,
//!   expected outputs; format `kvq-replay-plan/1`, see `kvq::export::ReplayPlan::to_json`);
//!
//! and `DIR/manifest.json` listing the scenarios with their kernels (entry points, dispatch
//! rules, bind group layouts). `web/replay.mjs DIR` replays the plans in Dawn. Building a
//! plan creates the cache on this machine's adapter (lavapipe will do); nothing is dispatched.

use std::path::PathBuf;

use kvq::GpuContext;
use kvq::export::{self, Target};

#[path = "shared/scenarios.rs"]
mod scenarios;

fn main() {
    if let Err(e) = run() {
        eprintln!("export_wgsl: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut dir = None;
    let mut target = Target::Browser;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--target" => {
                target = match args.next().as_deref() {
                    Some("browser") => Target::Browser,
                    Some("native") => Target::Native,
                    other => return Err(format!("--target browser|native, got {other:?}").into()),
                }
            }
            "--only" => only = Some(args.next().ok_or("--only needs a substring")?),
            "-h" | "--help" => {
                println!("usage: export_wgsl DIR [--target browser|native] [--only SUBSTRING]");
                return Ok(());
            }
            _ if dir.is_none() && !a.starts_with('-') => dir = Some(PathBuf::from(a)),
            _ => return Err(format!("unexpected argument '{a}'").into()),
        }
    }
    let dir = dir.ok_or("usage: export_wgsl DIR [--target browser|native] [--only SUBSTRING]")?;
    let ctx = GpuContext::new()?;
    eprintln!(
        "building plans on '{}' ({:?})",
        ctx.info.name, ctx.info.backend
    );
    std::fs::create_dir_all(&dir)?;
    let mut entries = Vec::new();
    let scenarios: Vec<_> = scenarios::scenarios()
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|o| s.name.contains(o.as_str())))
        .collect();
    if scenarios.is_empty() {
        return Err("no scenario matches".into());
    }
    for sc in &scenarios {
        let plan = export::replay_plan(&ctx, sc, target)?;
        let sub = dir.join(&sc.name);
        std::fs::create_dir_all(&sub)?;
        std::fs::write(sub.join("plan.json"), plan.to_json())?;
        let cache = kvq::KvCache::new(&ctx, sc.spec.clone())?;
        let kernels = export::export_kernels(cache.kernel_config(), target)?;
        for k in &kernels {
            std::fs::write(sub.join(format!("{}.wgsl", k.module.name())), &k.wgsl)?;
        }
        let files = export::kernels_json(&kernels, |k| {
            format!("{}/{}.wgsl", sc.name, k.module.name())
        });
        entries.push(format!(
            "{{\"name\":{},\"summary\":{},\"plan\":{},\"kernels\":{files}}}",
            export::json_string(&sc.name),
            export::json_string(&plan.summary),
            export::json_string(&format!("{}/plan.json", sc.name)),
        ));
        println!("{:<44} {}", sc.name, plan.summary);
    }
    let manifest = format!(
        "{{\"format\":\"kvq-export/1\",\"target\":{},\"adapter\":{},\"scenarios\":[\n{}\n]}}\n",
        export::json_string(target.name()),
        export::json_string(&ctx.info.name),
        entries.join(",\n")
    );
    std::fs::write(dir.join("manifest.json"), manifest)?;
    println!("wrote {} scenarios to {}", scenarios.len(), dir.display());
    Ok(())
}
