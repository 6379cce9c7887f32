// Attend-only hooks of the decode module: no tokens are appended, nothing is committed.

fn step_tokens(len: u32) -> u32 {
    return 0u;
}

fn write_new_rows(lid: u32, b: u32, h: u32, len: u32) {}

fn committed_len(b: u32) -> u32 {
    return 0u;
}

fn commit_step(b: u32, len: u32) {}
