//! WGSL of the matrix-unit probe ([`crate::matrix`]): the multiply-add pipe alone, fragments
//! loaded from workgroup memory every iteration, and f16 GEMMs with f32 accumulators, written
//! for wgpu's cooperative matrices (`enable wgpu_cooperative_matrix;`) at one fragment size
//! (16 or 8) and subgroup size.
//!
//! [`Ops::Emulated`] writes the same kernels with every cooperative operation replaced by a
//! plain-WGSL function over a whole fragment held by one invocation (each invocation plays one
//! subgroup), so that the GEMMs' data flow (staging, double buffering, tile indices, layouts)
//! runs where no adapter offers matrices (lavapipe) and is checked there against a CPU
//! reference (`tests/matrix_probe.rs`). The emulation follows naga's meaning of the
//! operations: `coopLoadT` / `coopStoreT` address element (r, c) at `p[r * stride + c]` (row
//! major), `coopLoad` / `coopStore` at `p[c * stride + r]` (column major); a stride counts
//! elements of the array the pointer points into (16-byte vectors for the wide tiles).
//!
//! This file has no dependencies, so the tests include it as it is.

use std::fmt::Write;

/// Whether cooperative operations are the hardware's or emulated in plain WGSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ops {
    /// `coopLoad` / `coopMultiplyAdd` / `coopStore` on `coop_matNxN` types.
    Native,
    /// One invocation holds a whole fragment (`array<f32, F * F>`) and plays one subgroup
    /// (tests/matrix_probe.rs runs these on lavapipe).
    #[allow(dead_code)]
    Emulated,
}

/// What the kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Fragment rows and columns (M = N = K of one multiply-add): 16 or 8.
    pub frag: u32,
    /// Invocations per subgroup (1 with [`Ops::Emulated`]).
    pub subgroup: u32,
    pub ops: Ops,
}

/// The GEMM's sizes: C (m × n, f32) = A (m × k, f16, row major) · B (k × n, f16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

/// One GEMM kernel: a workgroup computes a `bm × bn` block of C over K steps of `bk`, its
/// subgroups arranged `wm × wn`, each holding `bm / wm × bn / wn` of C as fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
    /// Workgroup tile buffers: 1, or 2 (the next K step is stored into the other while the
    /// current one multiplies: one barrier a step).
    pub stages: u32,
    /// The next K step's global loads are issued into registers before the current step's
    /// multiply-adds and stored after them.
    pub prefetch: bool,
    /// Tiles in workgroup memory as `vec4<u32>` (one 16-byte store per 8 values; fragments
    /// loaded through a `vec4<u32>` pointer, which NVIDIA's Vulkan driver 580 fails to
    /// compile) instead of `f16` (8 scalar stores, each pair unpacked and converted: naga has
    /// no bitcast from `u32` to `vec2<f16>`; the driver merges them into 8-byte stores).
    pub wide: bool,
    /// f16 elements of padding after each tile row (a multiple of 8).
    pub pad: u32,
    /// B stored transposed (n × k, K contiguous, as attention's K rows are): its fragments
    /// load column major.
    pub bt: bool,
    /// No staging: each subgroup loads its fragments straight from storage (`bk` is unused),
    /// with `prefetch` the next K step's fragments before the current multiply-adds.
    pub direct: bool,
}

/// One probe kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Multiply-adds on register-resident fragments, 8 independent accumulators a subgroup.
    Pipe,
    /// `fm × fn` accumulators fed by `fm` A and `fn` B fragments loaded from workgroup memory
    /// every iteration (`fm + fn` loads per `fm · fn` multiply-adds).
    Lds {
        fm: u32,
        fnn: u32,
    },
    Gemm(Gemm),
}

/// Subgroups a pipe or workgroup-load kernel's workgroup holds.
pub const LOOP_SUBGROUPS: u32 = 4;
/// Accumulators of the pipe kernel.
pub const PIPE_CHAINS: u32 = 8;
/// Fragments of each operand the workgroup-load kernel cycles through.
const LDS_SLOTS: u32 = 8;

impl Gemm {
    /// Fragments of C a subgroup holds along M and N.
    pub fn frags(&self, t: &Target) -> (u32, u32) {
        (self.bm / (self.wm * t.frag), self.bn / (self.wn * t.frag))
    }

    /// Invocations per workgroup.
    pub fn threads(&self, t: &Target) -> u32 {
        self.wm * self.wn * t.subgroup
    }

    /// Row stride (f16 elements) of the A tile and of the B tile in workgroup memory.
    fn strides(&self) -> (u32, u32) {
        let sa = self.bk + self.pad;
        let sb = if self.bt { self.bk } else { self.bn } + self.pad;
        (sa, sb)
    }

    /// f16 elements of one stage of the A tile and of the B tile.
    fn tile_elems(&self) -> (u32, u32) {
        let (sa, sb) = self.strides();
        let b_rows = if self.bt { self.bn } else { self.bk };
        (self.bm * sa, b_rows * sb)
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self) -> u32 {
        if self.direct {
            return 0;
        }
        let (a, b) = self.tile_elems();
        // The f16 tiles sit behind a vec4<f32> that aligns them to 16 bytes.
        self.stages * (a + b) * 2 + if self.wide { 0 } else { 16 }
    }

    /// Why this kernel cannot be written for `t` and `s`, if it cannot.
    pub fn check(&self, t: &Target, s: &Shape) -> Result<(), String> {
        let f = t.frag;
        let bad = |why: String| Err(why);
        if self.wm == 0
            || self.wn == 0
            || !self.bm.is_multiple_of(self.wm * f)
            || !self.bn.is_multiple_of(self.wn * f)
        {
            return bad(format!(
                "{}x{} blocks do not split into {}x{} subgroups of {f}x{f} fragments",
                self.bm, self.bn, self.wm, self.wn
            ));
        }
        if !s.m.is_multiple_of(self.bm) || !s.n.is_multiple_of(self.bn) || !s.k.is_multiple_of(f) {
            return bad(format!(
                "{}x{}x{} is no multiple of the block",
                s.m, s.n, s.k
            ));
        }
        if self.direct {
            return Ok(());
        }
        if !matches!((self.stages, self.prefetch), (1, _) | (2, true)) {
            return bad("two stages need the register prefetch".into());
        }
        if !self.bk.is_multiple_of(f)
            || !self.bk.is_multiple_of(8)
            || !s.k.is_multiple_of(self.bk)
            || !self.pad.is_multiple_of(8)
        {
            return bad(format!(
                "K step {} (pad {}) does not fit fragments of {f} and 8-value loads",
                self.bk, self.pad
            ));
        }
        let threads = self.threads(t);
        let (a_vecs, b_vecs) = (self.bm * self.bk / 8, self.bk * self.bn / 8);
        if a_vecs % threads != 0 || b_vecs % threads != 0 {
            return bad(format!(
                "{threads} invocations do not split the {}x{}x{} tiles into 8-value loads",
                self.bm, self.bn, self.bk
            ));
        }
        Ok(())
    }

    /// A name for tables and file names: `g128x128x32-w2x2-s2p-wide-pad8` (`-bt`: B
    /// transposed), `d64x64-w2x2-p` for the direct kernel.
    pub fn name(&self) -> String {
        if self.direct {
            return format!(
                "d{}x{}-w{}x{}{}{}",
                self.bm,
                self.bn,
                self.wm,
                self.wn,
                if self.prefetch { "-p" } else { "" },
                if self.bt { "-bt" } else { "" }
            );
        }
        format!(
            "g{}x{}x{}-w{}x{}-s{}{}-{}-pad{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.wm,
            self.wn,
            self.stages,
            if self.prefetch { "p" } else { "" },
            if self.wide { "wide" } else { "h" },
            self.pad,
            if self.bt { "-bt" } else { "" }
        )
    }
}

impl Kernel {
    /// The name the probe's table and `--matrix` use.
    pub fn name(&self) -> String {
        match self {
            Kernel::Pipe => "pipe".into(),
            Kernel::Lds { fm, fnn } => format!("lds-{fm}x{fnn}"),
            Kernel::Gemm(g) => g.name(),
        }
    }

    /// Invocations per workgroup.
    pub fn threads(&self, t: &Target) -> u32 {
        match self {
            Kernel::Gemm(g) => g.threads(t),
            _ => LOOP_SUBGROUPS * t.subgroup,
        }
    }

    /// Workgroup memory the kernel declares, in bytes.
    pub fn workgroup_bytes(&self, t: &Target) -> u32 {
        let f = t.frag;
        match self {
            Kernel::Gemm(g) => g.workgroup_bytes(),
            Kernel::Pipe => 2 * f * f * 2 + 16,
            Kernel::Lds { .. } => 2 * LDS_SLOTS * f * (f + 8) * 2 + 16,
        }
    }
}

/// How the generated code spells one fragment type and the cooperative operations.
struct Spell {
    t: Target,
    /// Emulation helpers, each generated once (name → WGSL).
    helpers: Vec<(String, String)>,
    /// The kernel's output array (storage): the emulation's loop bound reads its length.
    out: &'static str,
}

/// Where a fragment is loaded from or stored to: a module-scope array and its element type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Elem {
    F16,
    Vec4U32,
}

impl Spell {
    fn ty(&self, scalar: &str, role: &str) -> String {
        let f = self.t.frag;
        match self.t.ops {
            Ops::Native => format!("coop_mat{f}x{f}<{scalar}, {role}>"),
            Ops::Emulated => format!("array<f32, {}>", f * f),
        }
    }

    fn zero(&self) -> String {
        format!("{}()", self.ty("f32", "C"))
    }

    /// A fragment of `role` loaded from `array[index]` with `stride` (row major: `coopLoadT`).
    fn load(
        &mut self,
        role: &str,
        array: &str,
        elem: Elem,
        index: &str,
        stride: &str,
        row_major: bool,
    ) -> String {
        match self.t.ops {
            Ops::Native => {
                let scalar = if role == "C" { "f32" } else { "f16" };
                format!(
                    "coopLoad{}<{}>(&{array}[{index}], {stride})",
                    if row_major { "T" } else { "" },
                    self.ty(scalar, role)
                )
            }
            Ops::Emulated => {
                let name = format!(
                    "emu_load_{}_{}",
                    array.replace('.', "_"),
                    if row_major { "t" } else { "n" }
                );
                if !self.helpers.iter().any(|(n, _)| *n == name) {
                    let f = self.t.frag;
                    // `at` counts values of the fragment's type (f16 or f32) from the array's
                    // start; `base` and `stride` count the array's elements.
                    let per = if elem == Elem::Vec4U32 { 8 } else { 1 };
                    let at = if row_major {
                        format!("(base + row * stride) * {per}u + col")
                    } else {
                        format!("(base + col * stride) * {per}u + row")
                    };
                    let read = match elem {
                        Elem::F16 => format!("f32({array}[at])"),
                        // `at` counts f16 values: 8 to a vec4<u32>, 2 to a word.
                        Elem::Vec4U32 => {
                            format!("unpack2x16float({array}[at / 8u][(at % 8u) / 2u])[at % 2u]")
                        }
                    };
                    let body = format!(
                        "fn {name}(base: u32, stride: u32) -> array<f32, {ff}> {{\n    var m: array<f32, {ff}>;\n    for (var row = 0u; row < emu_n(); row++) {{\n        for (var col = 0u; col < emu_n(); col++) {{\n            let at = {at};\n            m[row * {f}u + col] = {read};\n        }}\n    }}\n    return m;\n}}\n",
                        ff = f * f
                    );
                    self.helpers.push((name.clone(), body));
                }
                format!("{name}({index}, {stride})")
            }
        }
    }

    fn mma(&mut self, a: &str, b: &str, c: &str) -> String {
        match self.t.ops {
            Ops::Native => format!("coopMultiplyAdd({a}, {b}, {c})"),
            Ops::Emulated => {
                let name = "emu_mma".to_string();
                if !self.helpers.iter().any(|(n, _)| *n == name) {
                    let f = self.t.frag;
                    let body = format!(
                        "fn emu_mma(x: array<f32, {ff}>, y: array<f32, {ff}>, acc: array<f32, {ff}>) -> array<f32, {ff}> {{\n    var d = acc;\n    for (var r = 0u; r < emu_n(); r++) {{\n        for (var j = 0u; j < emu_n(); j++) {{\n            var s = d[r * {f}u + j];\n            for (var k = 0u; k < emu_n(); k++) {{\n                s = fma(x[r * {f}u + k], y[k * {f}u + j], s);\n            }}\n            d[r * {f}u + j] = s;\n        }}\n    }}\n    return d;\n}}\n",
                        ff = f * f
                    );
                    self.helpers.push((name.clone(), body));
                }
                format!("emu_mma({a}, {b}, {c})")
            }
        }
    }

    /// Stores accumulator `value` to `array[index]` (f32 storage) with `stride`.
    fn store(
        &mut self,
        value: &str,
        array: &str,
        index: &str,
        stride: &str,
        row_major: bool,
    ) -> String {
        match self.t.ops {
            Ops::Native => format!(
                "coopStore{}({value}, &{array}[{index}], {stride});",
                if row_major { "T" } else { "" }
            ),
            Ops::Emulated => {
                let name = format!("emu_store_{array}_{}", if row_major { "t" } else { "n" });
                if !self.helpers.iter().any(|(n, _)| *n == name) {
                    let f = self.t.frag;
                    let addr = if row_major {
                        "row * stride + col"
                    } else {
                        "col * stride + row"
                    };
                    let body = format!(
                        "fn {name}(m: array<f32, {ff}>, base: u32, stride: u32) {{\n    for (var row = 0u; row < emu_n(); row++) {{\n        for (var col = 0u; col < emu_n(); col++) {{\n            {array}[base + {addr}] = m[row * {f}u + col];\n        }}\n    }}\n}}\n",
                        ff = f * f
                    );
                    self.helpers.push((name.clone(), body));
                }
                format!("{name}({value}, {index}, {stride});")
            }
        }
    }

    /// The module's first lines.
    fn header(&self) -> String {
        match self.t.ops {
            Ops::Native => "enable f16;\nenable wgpu_cooperative_matrix;\n\n".into(),
            Ops::Emulated => "enable f16;\n\n".into(),
        }
    }

    /// The entry point's parameters: the local index, the subgroup index (`sg`) and the
    /// workgroup id.
    fn entry_params(&self) -> String {
        match self.t.ops {
            Ops::Native => "@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32, @builtin(workgroup_id) wid: vec3<u32>".into(),
            Ops::Emulated => "@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>".into(),
        }
    }

    /// A line binding `sg` where the emulation has no subgroups (each invocation plays one).
    fn subgroup_line(&self) -> &'static str {
        match self.t.ops {
            Ops::Native => "",
            Ops::Emulated => "    let sg = lid;\n",
        }
    }

    fn finish(self, body: String) -> String {
        let mut out = self.header();
        if self.t.ops == Ops::Emulated {
            // The fragment size as the compiler cannot see it (the output is never shorter),
            // so that the helpers' loops stay loops: unrolled and inlined at every call, they
            // took lavapipe minutes to compile.
            let _ = writeln!(
                out,
                "fn emu_n() -> u32 {{\n    return min({}u, arrayLength(&{}));\n}}\n",
                self.t.frag, self.out
            );
        }
        for (_, h) in &self.helpers {
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(&body);
        out
    }
}

/// The WGSL of `kernel` for `t` (a GEMM of shape `s`; the loop kernels ignore it). Entry
/// point `main`. Bindings: the loop kernels `out: array<f32>` (0) and `params: array<u32>`
/// (1: the iteration count, then 1, the workgroup-load kernel's slot step); the GEMM `a` (0),
/// `b` (1) and `c` (2).
pub fn source(kernel: &Kernel, t: &Target, s: &Shape) -> Result<String, String> {
    let out = if matches!(kernel, Kernel::Gemm(_)) {
        "c"
    } else {
        "out"
    };
    let mut sp = Spell {
        t: *t,
        helpers: Vec::new(),
        out,
    };
    let body = match kernel {
        Kernel::Pipe => pipe(&mut sp),
        Kernel::Lds { fm, fnn } => lds(&mut sp, *fm, *fnn),
        Kernel::Gemm(g) => {
            g.check(t, s)?;
            if g.direct {
                direct(&mut sp, g, s)
            } else {
                staged(&mut sp, g, s)
            }
        }
    };
    Ok(sp.finish(body))
}

/// The loop kernels' bindings and their fragment source in workgroup memory.
fn loop_prelude(t: &Target, elems: u32) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n\
         @group(0) @binding(1) var<storage, read> params: array<u32>;\n\n\
         // The vec4<f32> aligns the f16 arrays to 16 bytes.\n\
         struct Frags {{ align: vec4<f32>, a: array<f16, {elems}>, b: array<f16, {elems}> }}\n\
         var<workgroup> frags: Frags;\n\n\
         @compute @workgroup_size({threads})\n",
        threads = LOOP_SUBGROUPS * t.subgroup
    )
}

/// Fills `frags.a` and `frags.b` with small values (no zeros), then a barrier.
fn loop_fill(elems: u32, threads: u32) -> String {
    format!(
        "    for (var i = lid; i < {elems}u; i += {threads}u) {{\n\
         \x20       frags.a[i] = f16(f32(i % 13u) * 0.01 - 0.06);\n\
         \x20       frags.b[i] = f16(f32(i % 11u) * 0.01 - 0.05);\n\
         \x20   }}\n\
         \x20   workgroupBarrier();\n"
    )
}

fn pipe(sp: &mut Spell) -> String {
    let t = sp.t;
    let f = t.frag;
    let mut w = loop_prelude(&t, f * f);
    writeln!(w, "fn main({}) {{", sp.entry_params()).unwrap();
    w.push_str(sp.subgroup_line());
    w.push_str(&loop_fill(f * f, LOOP_SUBGROUPS * t.subgroup));
    let la = sp.load("A", "frags.a", Elem::F16, "0u", &format!("{f}u"), true);
    let lb = sp.load("B", "frags.b", Elem::F16, "0u", &format!("{f}u"), true);
    writeln!(w, "    let fa = {la};\n    let fb = {lb};").unwrap();
    for c in 0..PIPE_CHAINS {
        writeln!(w, "    var c{c} = {};", sp.zero()).unwrap();
    }
    w.push_str("    let rounds = params[0];\n    for (var r = 0u; r < rounds; r++) {\n");
    for c in 0..PIPE_CHAINS {
        let m = sp.mma("fa", "fb", &format!("c{c}"));
        writeln!(w, "        c{c} = {m};").unwrap();
    }
    w.push_str("    }\n");
    // Every subgroup stores to the same slots: the values do not matter, the stores keep
    // every chain alive.
    for c in 0..PIPE_CHAINS {
        let st = sp.store(
            &format!("c{c}"),
            "out",
            &format!("{}u", c * f * f),
            &format!("{f}u"),
            true,
        );
        writeln!(w, "    {st}").unwrap();
    }
    w.push_str("}\n");
    w
}

fn lds(sp: &mut Spell, fm: u32, fnn: u32) -> String {
    let t = sp.t;
    let f = t.frag;
    // Each slot a padded f x f fragment (rows of f + 8 values, as a staged tile's).
    let st = f + 8;
    let elems = LDS_SLOTS * f * st;
    let mut w = loop_prelude(&t, elems);
    writeln!(w, "fn main({}) {{", sp.entry_params()).unwrap();
    w.push_str(sp.subgroup_line());
    w.push_str(&loop_fill(elems, LOOP_SUBGROUPS * t.subgroup));
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(w, "    var c{i}_{j} = {};", sp.zero()).unwrap();
        }
    }
    // Slots that change every iteration by a step the compiler cannot see (params[1] = 1),
    // so that no load is hoisted out of the loop or shared between unrolled iterations.
    w.push_str("    let rounds = params[0];\n    let step = params[1];\n    for (var r = 0u; r < rounds; r++) {\n");
    for i in 0..fm {
        let l = sp.load(
            "A",
            "frags.a",
            Elem::F16,
            &format!("((r * step + {i}u) % {LDS_SLOTS}u) * {}u", f * st),
            &format!("{st}u"),
            true,
        );
        writeln!(w, "        let fa{i} = {l};").unwrap();
    }
    for j in 0..fnn {
        let l = sp.load(
            "B",
            "frags.b",
            Elem::F16,
            &format!("((r * step + {}u) % {LDS_SLOTS}u) * {}u", 2 * j + 1, f * st),
            &format!("{st}u"),
            true,
        );
        writeln!(w, "        let fb{j} = {l};").unwrap();
    }
    for i in 0..fm {
        for j in 0..fnn {
            let m = sp.mma(&format!("fa{i}"), &format!("fb{j}"), &format!("c{i}_{j}"));
            writeln!(w, "        c{i}_{j} = {m};").unwrap();
        }
    }
    w.push_str("    }\n");
    for i in 0..fm {
        for j in 0..fnn {
            let st = sp.store(
                &format!("c{i}_{j}"),
                "out",
                &format!("{}u", (i * fnn + j) * f * f),
                &format!("{f}u"),
                true,
            );
            writeln!(w, "    {st}").unwrap();
        }
    }
    w.push_str("}\n");
    w
}

/// Stores the subgroup's accumulators to C; the WGSL values `m0` / `n0` are its first row
/// and column.
fn store_c(sp: &mut Spell, w: &mut String, (m0, n0): (&str, &str), fm: u32, fnn: u32, s: &Shape) {
    let f = sp.t.frag;
    for i in 0..fm {
        for j in 0..fnn {
            let st = sp.store(
                &format!("c{i}_{j}"),
                "c",
                &format!("({m0} + {}u) * {}u + {n0} + {}u", i * f, s.n, j * f),
                &format!("{}u", s.n),
                true,
            );
            writeln!(w, "    {st}").unwrap();
        }
    }
}

/// Fragments straight from storage, no workgroup memory.
fn direct(sp: &mut Spell, g: &Gemm, s: &Shape) -> String {
    let t = sp.t;
    let f = t.frag;
    let (fm, fnn) = g.frags(&t);
    let mut w = String::new();
    writeln!(
        w,
        "@group(0) @binding(0) var<storage, read> a: array<f16>;\n\
         @group(0) @binding(1) var<storage, read> b: array<f16>;\n\
         @group(0) @binding(2) var<storage, read_write> c: array<f32>;\n\n\
         @compute @workgroup_size({})\nfn main({}) {{",
        g.threads(&t),
        sp.entry_params()
    )
    .unwrap();
    w.push_str(sp.subgroup_line());
    writeln!(
        w,
        "    let m0 = wid.y * {}u + (sg / {}u) * {}u;",
        g.bm,
        g.wn,
        fm * f
    )
    .unwrap();
    writeln!(
        w,
        "    let n0 = wid.x * {}u + (sg % {}u) * {}u;",
        g.bn,
        g.wn,
        fnn * f
    )
    .unwrap();
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(w, "    var c{i}_{j} = {};", sp.zero()).unwrap();
        }
    }
    let loads = |sp: &mut Spell, k: &str, prefix: &str, decl: &str, w: &mut String| {
        for i in 0..fm {
            let l = sp.load(
                "A",
                "a",
                Elem::F16,
                &format!("(m0 + {}u) * {}u + {k}", i * f, s.k),
                &format!("{}u", s.k),
                true,
            );
            writeln!(w, "{decl}{prefix}a{i} = {l};").unwrap();
        }
        for j in 0..fnn {
            let l = if g.bt {
                sp.load(
                    "B",
                    "b",
                    Elem::F16,
                    &format!("(n0 + {}u) * {}u + {k}", j * f, s.k),
                    &format!("{}u", s.k),
                    false,
                )
            } else {
                sp.load(
                    "B",
                    "b",
                    Elem::F16,
                    &format!("{k} * {}u + n0 + {}u", s.n, j * f),
                    &format!("{}u", s.n),
                    true,
                )
            };
            writeln!(w, "{decl}{prefix}b{j} = {l};").unwrap();
        }
    };
    if g.prefetch {
        loads(sp, "0u", "f", "    var ", &mut w);
    }
    writeln!(w, "    for (var k = 0u; k < {}u; k += {f}u) {{", s.k).unwrap();
    if g.prefetch {
        // The last step loads its own fragments again rather than branch.
        writeln!(w, "        let kn = min(k + {f}u, {}u);", s.k - f).unwrap();
        loads(sp, "kn", "n", "        let ", &mut w);
    } else {
        loads(sp, "k", "f", "        let ", &mut w);
    }
    for i in 0..fm {
        for j in 0..fnn {
            let m = sp.mma(&format!("fa{i}"), &format!("fb{j}"), &format!("c{i}_{j}"));
            writeln!(w, "        c{i}_{j} = {m};").unwrap();
        }
    }
    if g.prefetch {
        for i in 0..fm {
            writeln!(w, "        fa{i} = na{i};").unwrap();
        }
        for j in 0..fnn {
            writeln!(w, "        fb{j} = nb{j};").unwrap();
        }
    }
    w.push_str("    }\n");
    store_c(sp, &mut w, ("m0", "n0"), fm, fnn, s);
    w.push_str("}\n");
    w
}

/// Tiles staged through workgroup memory by 16-byte global loads.
fn staged(sp: &mut Spell, g: &Gemm, s: &Shape) -> String {
    let t = sp.t;
    let f = t.frag;
    let (fm, fnn) = g.frags(&t);
    let threads = g.threads(&t);
    let (sa, sb) = g.strides();
    let (ta, tb) = g.tile_elems();
    let (kv, nv) = (s.k / 8, s.n / 8);
    let steps = s.k / g.bk;
    // 8-value vectors per tile row, and rows one pass of the workgroup covers.
    let a_cols = g.bk / 8;
    let b_cols = if g.bt { g.bk } else { g.bn } / 8;
    // Row and column (in 8-value vectors) of the i-th vector this invocation loads of a tile
    // with `cols` of them a row: `r` + a constant and `c` where the workgroup covers whole
    // rows, else from the vector's index.
    let share = |i: u32, cols: u32, r: &str, c: &str| {
        if threads.is_multiple_of(cols) {
            (format!("{r} + {}u", i * threads / cols), c.to_string())
        } else {
            (
                format!("(lid + {}u) / {cols}u", i * threads),
                format!("((lid + {}u) % {cols}u)", i * threads),
            )
        }
    };
    let (la, lb) = (g.bm * g.bk / 8 / threads, g.bk * g.bn / 8 / threads);
    let mut w = String::new();
    writeln!(
        w,
        "@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;\n\
         @group(0) @binding(1) var<storage, read> b: array<vec4<u32>>;\n\
         @group(0) @binding(2) var<storage, read_write> c: array<f32>;\n"
    )
    .unwrap();
    let (elem, div) = if g.wide {
        writeln!(
            w,
            "struct Tiles {{ a: array<vec4<u32>, {}>, b: array<vec4<u32>, {}> }}",
            g.stages * ta / 8,
            g.stages * tb / 8
        )
        .unwrap();
        (Elem::Vec4U32, 8)
    } else {
        writeln!(w, "// The vec4<f32> aligns the f16 tiles to 16 bytes.\nstruct Tiles {{ align: vec4<f32>, a: array<f16, {}>, b: array<f16, {}> }}", g.stages * ta, g.stages * tb).unwrap();
        (Elem::F16, 1)
    };
    writeln!(
        w,
        "var<workgroup> tiles: Tiles;\n\n@compute @workgroup_size({threads})\nfn main({}) {{",
        sp.entry_params()
    )
    .unwrap();
    w.push_str(sp.subgroup_line());
    writeln!(
        w,
        "    let m0 = wid.y * {}u;\n    let n0 = wid.x * {}u;",
        g.bm, g.bn
    )
    .unwrap();
    // This invocation's first vector of each tile: row ar, column ac (8 values each).
    writeln!(w, "    let ar = lid / {a_cols}u;\n    let ac = lid % {a_cols}u;\n    let br = lid / {b_cols}u;\n    let bc = lid % {b_cols}u;").unwrap();
    // The subgroup's fragment origins in the tiles (f16 elements).
    let b_frag = if g.bt {
        format!("(sg % {}u) * {}u", g.wn, fnn * f * sb)
    } else {
        format!("(sg % {}u) * {}u", g.wn, fnn * f)
    };
    writeln!(
        w,
        "    let fa_at = (sg / {}u) * {}u;\n    let fb_at = {b_frag};",
        g.wn,
        fm * f * sa
    )
    .unwrap();
    for i in 0..fm {
        for j in 0..fnn {
            writeln!(w, "    var c{i}_{j} = {};", sp.zero()).unwrap();
        }
    }
    for i in 0..la {
        writeln!(w, "    var ra{i}: vec4<u32>;").unwrap();
    }
    for i in 0..lb {
        writeln!(w, "    var rb{i}: vec4<u32>;").unwrap();
    }
    // Global loads of K step `step` into the registers.
    let load_regs = |step: &str| {
        let mut l = String::new();
        for i in 0..la {
            let (r, c) = share(i, a_cols, "ar", "ac");
            writeln!(
                l,
                "        ra{i} = a[(m0 + {r}) * {kv}u + {step} * {a_cols}u + {c}];"
            )
            .unwrap();
        }
        for i in 0..lb {
            let (r, c) = share(i, b_cols, "br", "bc");
            if g.bt {
                writeln!(
                    l,
                    "        rb{i} = b[(n0 + {r}) * {kv}u + {step} * {b_cols}u + {c}];"
                )
                .unwrap();
            } else {
                writeln!(
                    l,
                    "        rb{i} = b[({step} * {}u + {r}) * {nv}u + n0 / 8u + {c}];",
                    g.bk
                )
                .unwrap();
            }
        }
        l
    };
    // Stores of the registers into tile buffer `buf`.
    let store_regs = |buf: &str| {
        let mut l = String::new();
        let put = |l: &mut String, arr: &str, at: String, reg: String| {
            if g.wide {
                writeln!(l, "        tiles.{arr}[({at}) / 8u] = {reg};").unwrap();
            } else {
                writeln!(l, "        {{\n            let o = {at};").unwrap();
                for (q, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    writeln!(l, "            let h{q} = vec2<f16>(unpack2x16float({reg}.{comp}));\n            tiles.{arr}[o + {}u] = h{q}.x;\n            tiles.{arr}[o + {}u] = h{q}.y;", 2 * q, 2 * q + 1).unwrap();
                }
                l.push_str("        }\n");
            }
        };
        for i in 0..la {
            let (r, c) = share(i, a_cols, "ar", "ac");
            put(
                &mut l,
                "a",
                format!("{buf} * {ta}u + ({r}) * {sa}u + {c} * 8u"),
                format!("ra{i}"),
            );
        }
        for i in 0..lb {
            let (r, c) = share(i, b_cols, "br", "bc");
            put(
                &mut l,
                "b",
                format!("{buf} * {tb}u + ({r}) * {sb}u + {c} * 8u"),
                format!("rb{i}"),
            );
        }
        l
    };
    // The multiply-adds of tile buffer `buf`, K step by K step of one fragment.
    let multiply = |sp: &mut Spell, buf: &str| {
        let mut l = String::new();
        for kk in (0..g.bk).step_by(f as usize) {
            l.push_str("        {\n");
            for i in 0..fm {
                let at = format!("({buf} * {ta}u + fa_at + {}u) / {div}u", i * f * sa + kk);
                let ld = sp.load("A", "tiles.a", elem, &at, &format!("{}u", sa / div), true);
                writeln!(l, "            let fa{i} = {ld};").unwrap();
            }
            for j in 0..fnn {
                let ld = if g.bt {
                    let at = format!("({buf} * {tb}u + fb_at + {}u) / {div}u", j * f * sb + kk);
                    sp.load("B", "tiles.b", elem, &at, &format!("{}u", sb / div), false)
                } else {
                    let at = format!("({buf} * {tb}u + fb_at + {}u) / {div}u", kk * sb + j * f);
                    sp.load("B", "tiles.b", elem, &at, &format!("{}u", sb / div), true)
                };
                writeln!(l, "            let fb{j} = {ld};").unwrap();
            }
            for i in 0..fm {
                for j in 0..fnn {
                    let m = sp.mma(&format!("fa{i}"), &format!("fb{j}"), &format!("c{i}_{j}"));
                    writeln!(l, "            c{i}_{j} = {m};").unwrap();
                }
            }
            l.push_str("        }\n");
        }
        l
    };
    match (g.stages, g.prefetch) {
        (1, false) => {
            writeln!(w, "    for (var t = 0u; t < {steps}u; t++) {{").unwrap();
            w.push_str(&load_regs("t"));
            w.push_str(&store_regs("0u"));
            w.push_str("        workgroupBarrier();\n");
            w.push_str(&multiply(sp, "0u"));
            w.push_str("        workgroupBarrier();\n    }\n");
        }
        (1, true) => {
            w.push_str("    {\n");
            w.push_str(&load_regs("0u"));
            w.push_str(&store_regs("0u"));
            w.push_str("    }\n    workgroupBarrier();\n");
            writeln!(w, "    for (var t = 0u; t < {steps}u; t++) {{").unwrap();
            // The last step loads its own tile again rather than branch.
            writeln!(w, "        let tn = min(t + 1u, {}u);", steps - 1).unwrap();
            w.push_str(&load_regs("tn"));
            w.push_str(&multiply(sp, "0u"));
            w.push_str("        workgroupBarrier();\n");
            w.push_str(&store_regs("0u"));
            w.push_str("        workgroupBarrier();\n    }\n");
        }
        _ => {
            w.push_str("    {\n");
            w.push_str(&load_regs("0u"));
            w.push_str(&store_regs("0u"));
            w.push_str("    }\n    workgroupBarrier();\n");
            writeln!(w, "    for (var t = 0u; t < {steps}u; t++) {{").unwrap();
            writeln!(w, "        let tn = min(t + 1u, {}u);\n        let cur = t % 2u;\n        let nxt = 1u - cur;", steps - 1).unwrap();
            w.push_str(&load_regs("tn"));
            w.push_str(&multiply(sp, "cur"));
            // Into the other buffer, which every subgroup finished reading before the last
            // barrier; the last step rewrites it unread.
            w.push_str(&store_regs("nxt"));
            w.push_str("        workgroupBarrier();\n    }\n");
        }
    }
    writeln!(
        w,
        "    let m0c = m0 + (sg / {}u) * {}u;\n    let n0c = n0 + (sg % {}u) * {}u;",
        g.wn,
        fm * f,
        g.wn,
        fnn * f
    )
    .unwrap();
    store_c(sp, &mut w, ("m0c", "n0c"), fm, fnn, s);
    w.push_str("}\n");
    w
}

/// A probe variant: a kernel, and whether it is compiled with wgpu's shader runtime checks
/// (bounds clamping, loop bounding, zeroed workgroup memory) instead of without them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub kernel: Kernel,
    pub checks: bool,
}

impl Variant {
    /// The kernel's name, `+checks` where compiled with the runtime checks.
    pub fn name(&self) -> String {
        format!(
            "{}{}",
            self.kernel.name(),
            if self.checks { "+checks" } else { "" }
        )
    }
}

/// A staged GEMM's variant without runtime checks (`stages` 2 implies the prefetch).
#[allow(clippy::too_many_arguments)]
const fn staged_gemm(
    bm: u32,
    bn: u32,
    bk: u32,
    wm: u32,
    wn: u32,
    stages: u32,
    prefetch: bool,
    wide: bool,
    pad: u32,
    bt: bool,
) -> Gemm {
    Gemm {
        bm,
        bn,
        bk,
        wm,
        wn,
        stages,
        prefetch,
        wide,
        pad,
        bt,
        direct: false,
    }
}

/// A direct GEMM (fragments straight from storage).
const fn direct_gemm(bm: u32, bn: u32, wm: u32, wn: u32, prefetch: bool) -> Gemm {
    Gemm {
        bm,
        bn,
        bk: 0,
        wm,
        wn,
        stages: 1,
        prefetch,
        wide: false,
        pad: 0,
        bt: false,
        direct: true,
    }
}

/// Every variant the probe knows, in the order it runs them: the loop kernels, the kernels of
/// the earlier measurements (direct 16x16 tiles; 64x64 and 128x128 blocks staged through
/// single-buffered f16 tiles, with and without checks), then the staging techniques one at a
/// time (register prefetch, two stages, K steps, block and subgroup shapes, B transposed,
/// padding), and last the 16-byte workgroup stores, whose `vec4<u32>` fragment loads NVIDIA's
/// Vulkan driver 580 fails to compile ("NVVM compilation failed"), losing the device.
pub fn variants() -> Vec<Variant> {
    let unchecked = |kernel| Variant {
        kernel,
        checks: false,
    };
    let checked = |kernel| Variant {
        kernel,
        checks: true,
    };
    let g = Kernel::Gemm;
    // f16 tiles (8 scalar stores per 16 bytes, which the compiler merges into 8-byte ones).
    let h = |bm, bn, bk, wm, wn, stages, prefetch, pad, bt| {
        g(staged_gemm(
            bm, bn, bk, wm, wn, stages, prefetch, false, pad, bt,
        ))
    };
    vec![
        unchecked(Kernel::Pipe),
        unchecked(Kernel::Lds { fm: 2, fnn: 4 }),
        unchecked(Kernel::Lds { fm: 4, fnn: 4 }),
        unchecked(Kernel::Lds { fm: 4, fnn: 2 }),
        checked(g(direct_gemm(16, 64, 1, 4, false))),
        unchecked(g(direct_gemm(16, 64, 1, 4, false))),
        unchecked(g(direct_gemm(128, 128, 2, 2, true))),
        checked(h(64, 64, 16, 2, 2, 1, false, 0, false)),
        unchecked(h(64, 64, 16, 2, 2, 1, false, 0, false)),
        checked(h(128, 128, 16, 2, 2, 1, false, 0, false)),
        unchecked(h(128, 128, 16, 2, 2, 1, false, 0, false)),
        checked(h(128, 128, 32, 2, 2, 1, true, 8, false)),
        unchecked(h(128, 128, 32, 2, 2, 1, true, 8, false)),
        unchecked(h(128, 128, 32, 2, 2, 1, true, 0, false)),
        unchecked(h(128, 128, 32, 2, 2, 1, true, 8, true)),
        unchecked(h(128, 128, 64, 2, 2, 1, true, 8, false)),
        unchecked(h(128, 128, 64, 2, 2, 1, true, 8, true)),
        unchecked(h(128, 128, 32, 2, 2, 2, true, 8, false)),
        checked(h(128, 128, 32, 2, 2, 2, true, 8, false)),
        unchecked(h(128, 128, 32, 2, 2, 2, true, 8, true)),
        unchecked(h(128, 128, 16, 2, 2, 2, true, 8, false)),
        unchecked(h(128, 128, 32, 2, 4, 1, true, 8, false)),
        unchecked(h(128, 128, 32, 4, 2, 1, true, 8, false)),
        unchecked(h(64, 128, 32, 2, 2, 1, true, 8, false)),
        unchecked(h(128, 256, 32, 2, 4, 1, true, 8, false)),
        unchecked(h(256, 128, 32, 4, 2, 1, true, 8, false)),
        unchecked(h(128, 256, 16, 2, 4, 2, true, 8, false)),
        unchecked(g(staged_gemm(128, 128, 32, 2, 2, 1, true, true, 8, false))),
    ]
}
