//! Parsing a `--codecs` list, shared by the examples (`#[path]`-included; not an example of
//! its own).

/// Splits a `--codecs` list on commas, keeping `k=<codec>,v=<codec>` names whole.
pub fn split_codecs(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',').map(str::trim) {
        match out.last_mut() {
            Some(prev) if part.starts_with("v=") && prev.starts_with("k=") => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}
