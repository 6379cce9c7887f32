//! Where the examples and tests find the real model (SmolLM2-135M's GGUF), fetching it when
//! it is missing (`#[path]`-included; not an example of its own).

use std::path::{Path, PathBuf};

/// Where `bench/fetch-smollm2.sh` puts the model, under the crate root.
pub const DEFAULT_MODEL: &str = ".models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model path: `path`, else `$KVQ_MODEL`, else [`DEFAULT_MODEL`] under the crate root
/// (fetched by `bench/fetch-smollm2.sh` when it is missing; a failed fetch is an error).
pub fn model_path(path: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = path.or_else(|| std::env::var_os("KVQ_MODEL").map(PathBuf::from)) {
        return Ok(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join(DEFAULT_MODEL);
    if !path.exists() {
        eprintln!(
            "{} is missing: running bench/fetch-smollm2.sh",
            path.display()
        );
        let status = std::process::Command::new("bash")
            .arg(root.join("bench/fetch-smollm2.sh"))
            .status()
            .map_err(|e| format!("bench/fetch-smollm2.sh: {e}"))?;
        if !status.success() {
            return Err(format!(
                "bench/fetch-smollm2.sh failed ({status}): no model"
            ));
        }
    }
    Ok(path)
}
