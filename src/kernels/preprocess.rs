//! kvq's one WGSL assembly mechanism: a small preprocessor over the files under `wgsl/`.
//!
//! A kernel module is one root file (`wgsl/kernels/*.wgsl`) expanded against a table of
//! [`Defines`]: the cache's shape, codec and tuning constants (emitted as WGSL `const`s in
//! front of the module, so Rust and WGSL read the same numbers) and the module's switches
//! (preprocessor-only). Directives are lines whose first non-blank character is `#`:
//!
//! * `#include "dir/file.wgsl" name=value ...`: the file's text here; the parameters are in
//!   scope for that file and the files it includes, as `{{name}}` anywhere in a line.
//! * `#if EXPR`, `#elif EXPR`, `#else`, `#endif`: keep lines by a condition over the defines
//!   (`==`, `!=`, `<`, `<=`, `>`, `>=`, `!`, `&&`, `||`, parentheses, integers, `true`,
//!   `false`); a name that is not defined is an error, not false.
//! * `#unroll $t COUNT`: from here on, every line of this file holding `$t` is repeated
//!   `COUNT` times (a `u32` define), `$t` reading 0, 1, ... in the copies. Several unrolls of
//!   one line nest in the order they were declared. Per-head and per-load state then lives in
//!   named registers rather than in a private array indexed at run time (which most GPU
//!   compilers spill to memory), and load batches are explicit, so many loads are in flight
//!   before their math.
//!
//! Every error names the file and line; nothing here panics.

use crate::error::{KvqError, Result};

/// Every WGSL file kvq assembles from, by its path under `wgsl/`.
const FILES: &[(&str, &str)] = &[
    (
        "shared/common.wgsl",
        include_str!("../../wgsl/shared/common.wgsl"),
    ),
    (
        "shared/input.wgsl",
        include_str!("../../wgsl/shared/input.wgsl"),
    ),
    (
        "shared/rotate.wgsl",
        include_str!("../../wgsl/shared/rotate.wgsl"),
    ),
    (
        "shared/encode_rows.wgsl",
        include_str!("../../wgsl/shared/encode_rows.wgsl"),
    ),
    (
        "shared/lengths.wgsl",
        include_str!("../../wgsl/shared/lengths.wgsl"),
    ),
    (
        "shared/exact.wgsl",
        include_str!("../../wgsl/shared/exact.wgsl"),
    ),
    (
        "codecs/stores.wgsl",
        include_str!("../../wgsl/codecs/stores.wgsl"),
    ),
    (
        "codecs/f16.wgsl",
        include_str!("../../wgsl/codecs/f16.wgsl"),
    ),
    (
        "codecs/sym.wgsl",
        include_str!("../../wgsl/codecs/sym.wgsl"),
    ),
    (
        "codecs/rot.wgsl",
        include_str!("../../wgsl/codecs/rot.wgsl"),
    ),
    (
        "codecs/readers.wgsl",
        include_str!("../../wgsl/codecs/readers.wgsl"),
    ),
    (
        "codecs/read_k_f16.wgsl",
        include_str!("../../wgsl/codecs/read_k_f16.wgsl"),
    ),
    (
        "codecs/read_k_q8.wgsl",
        include_str!("../../wgsl/codecs/read_k_q8.wgsl"),
    ),
    (
        "codecs/read_k_q4.wgsl",
        include_str!("../../wgsl/codecs/read_k_q4.wgsl"),
    ),
    (
        "codecs/read_k_rot.wgsl",
        include_str!("../../wgsl/codecs/read_k_rot.wgsl"),
    ),
    (
        "codecs/read_v_f16.wgsl",
        include_str!("../../wgsl/codecs/read_v_f16.wgsl"),
    ),
    (
        "codecs/read_v_sym.wgsl",
        include_str!("../../wgsl/codecs/read_v_sym.wgsl"),
    ),
    (
        "codecs/read_v_rot.wgsl",
        include_str!("../../wgsl/codecs/read_v_rot.wgsl"),
    ),
    (
        "kernels/append.wgsl",
        include_str!("../../wgsl/kernels/append.wgsl"),
    ),
    (
        "kernels/decode.wgsl",
        include_str!("../../wgsl/kernels/decode.wgsl"),
    ),
    (
        "kernels/step.wgsl",
        include_str!("../../wgsl/kernels/step.wgsl"),
    ),
    (
        "kernels/attention.wgsl",
        include_str!("../../wgsl/kernels/attention.wgsl"),
    ),
    (
        "kernels/prefill.wgsl",
        include_str!("../../wgsl/kernels/prefill.wgsl"),
    ),
    (
        "kernels/prefill_matrix.wgsl",
        include_str!("../../wgsl/kernels/prefill_matrix.wgsl"),
    ),
    (
        "kernels/softmax_tile.wgsl",
        include_str!("../../wgsl/kernels/softmax_tile.wgsl"),
    ),
    (
        "kernels/softmax_sum.wgsl",
        include_str!("../../wgsl/kernels/softmax_sum.wgsl"),
    ),
];

/// Deepest chain of includes (a cycle stops here with an error).
const MAX_DEPTH: usize = 16;

/// A define's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// A WGSL `u32` (emitted as `const NAME: u32 = Nu;`).
    U32(u32),
    /// A WGSL `bool`.
    Bool(bool),
    /// A WGSL `f32` (emitted in Rust's `{:e}` form, exact).
    F32(f32),
    /// A number the kernels read at run time: every use of the name in code becomes this
    /// WGSL expression (a uniform's field), so the text does not depend on its value. Not
    /// emitted as a `const`, and not known to `#if` or `#unroll`.
    Uniform(&'static str),
}

/// The names a module is assembled against, in order: WGSL constants and switches.
#[derive(Clone, Debug, Default)]
pub(crate) struct Defines {
    entries: Vec<(String, Value, bool)>,
    enables: Vec<&'static str>,
}

impl Defines {
    /// A constant: known to the preprocessor and emitted as a WGSL `const`.
    pub fn constant(&mut self, name: &str, value: Value) {
        self.entries.push((name.to_string(), value, true));
    }

    /// A module switch: known to the preprocessor only.
    pub fn switch(&mut self, name: &str, on: bool) {
        self.entries
            .push((name.to_string(), Value::Bool(on), false));
    }

    /// A WGSL extension the module enables (`enable NAME;`, emitted first).
    pub fn enable(&mut self, extension: &'static str) {
        self.enables.push(extension);
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.entries
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| v)
    }

    /// The module's `enable` directives, then the WGSL `const` block of every constant, in
    /// definition order.
    pub fn wgsl_consts(&self) -> String {
        let mut h: String = self
            .enables
            .iter()
            .map(|e| format!("enable {e};\n"))
            .collect();
        h += "// Generated by kvq for one kernel configuration.\n";
        for (name, value, emit) in &self.entries {
            if !emit {
                continue;
            }
            h += &match value {
                Value::U32(v) => format!("const {name}: u32 = {v}u;\n"),
                Value::Bool(v) => format!("const {name}: bool = {v};\n"),
                Value::F32(v) => format!("const {name}: f32 = {v:e};\n"),
                Value::Uniform(_) => continue,
            };
        }
        h
    }

    /// The names read at run time, with their WGSL expressions ([`Value::Uniform`]).
    fn uniforms(&self) -> Vec<(&str, &'static str)> {
        self.entries
            .iter()
            .filter_map(|(n, v, _)| match v {
                Value::Uniform(e) => Some((n.as_str(), *e)),
                _ => None,
            })
            .collect()
    }
}

/// The module rooted at `root` (a path under `wgsl/`): the defines' `const` block, then the
/// expanded text.
pub(crate) fn assemble(root: &str, defines: &Defines) -> Result<String> {
    assemble_from(FILES, root, defines)
}

/// [`assemble`] over another set of files (the tests').
fn assemble_from(files: &[(&str, &str)], root: &str, defines: &Defines) -> Result<String> {
    // One meaning per name: a switch that shadowed a constant would make `#if` and the
    // WGSL `const` disagree.
    for (i, (name, _, _)) in defines.entries.iter().enumerate() {
        if defines.entries[..i].iter().any(|(n, _, _)| n == name) {
            return Err(KvqError::Gpu(format!(
                "kvq WGSL define `{name}` defined twice"
            )));
        }
    }
    let mut out = defines.wgsl_consts();
    let mut cx = Context {
        files,
        defines,
        uniforms: defines.uniforms(),
        scope: Vec::new(),
    };
    cx.expand_file(root, 0, &mut out)?;
    Ok(out)
}

/// What an expansion reads: the files, the defines (and of them the names read at run time),
/// and the include parameters in scope.
struct Context<'a> {
    files: &'a [(&'a str, &'a str)],
    defines: &'a Defines,
    uniforms: Vec<(&'a str, &'static str)>,
    scope: Vec<(String, String)>,
}

fn error(path: &str, line: usize, what: impl std::fmt::Display) -> KvqError {
    KvqError::Gpu(format!("wgsl/{path}:{line}: {what}"))
}

/// One open `#if` ... `#endif`: whether its enclosing lines are kept, whether a branch was
/// taken already, whether the current branch is kept.
struct Cond {
    outer: bool,
    taken: bool,
    on: bool,
    line: usize,
    /// Whether `#else` came already (no `#elif` or `#else` may follow it).
    after_else: bool,
}

impl Context<'_> {
    fn expand_file(&mut self, path: &str, depth: usize, out: &mut String) -> Result<()> {
        let defines = self.defines;
        let text = self
            .files
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, t)| *t)
            .ok_or_else(|| error(path, 0, "no such kvq WGSL file"))?;
        if depth > MAX_DEPTH {
            return Err(error(path, 0, "includes nest too deep (a cycle?)"));
        }
        let mut conds: Vec<Cond> = Vec::new();
        let mut unrolls: Vec<(String, u32)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let active = conds.last().is_none_or(|c| c.on);
            let is_directive = raw.trim_start().starts_with('#');
            if !active && !is_directive {
                continue;
            }
            let line = substitute(raw, &self.scope).map_err(|e| error(path, n, e))?;
            let Some(directive) = line.trim_start().strip_prefix('#') else {
                emit(&read_uniforms(&line, &self.uniforms), &unrolls, out);
                continue;
            };
            let (word, rest) = directive
                .split_once(char::is_whitespace)
                .unwrap_or((directive, ""));
            let rest = rest.trim();
            let eval = |e: &str| evaluate(e, defines).map_err(|m| error(path, n, m));
            if matches!(word, "else" | "endif") && !rest.is_empty() {
                return Err(error(path, n, format!("text after #{word}: `{rest}`")));
            }
            match word {
                "if" => {
                    let on = active && eval(rest)?;
                    conds.push(Cond {
                        outer: active,
                        taken: on,
                        on,
                        line: n,
                        after_else: false,
                    });
                }
                "elif" | "else" => {
                    let c = conds
                        .last_mut()
                        .ok_or_else(|| error(path, n, format!("#{word} without #if")))?;
                    if c.after_else {
                        return Err(error(path, n, format!("#{word} after #else")));
                    }
                    c.after_else = word == "else";
                    let on = c.outer && !c.taken && (word == "else" || eval(rest)?);
                    c.taken |= on;
                    c.on = on;
                }
                "endif" => {
                    conds
                        .pop()
                        .ok_or_else(|| error(path, n, "#endif without #if"))?;
                }
                "include" if active => {
                    let (file, params) = parse_include(rest).map_err(|e| error(path, n, e))?;
                    if !self.files.iter().any(|(p, _)| *p == file) {
                        return Err(error(path, n, format!("no kvq WGSL file `{file}`")));
                    }
                    let outer = self.scope.len();
                    self.scope.extend(params);
                    self.expand_file(&file, depth + 1, out)?;
                    self.scope.truncate(outer);
                }
                "unroll" if active => {
                    let mut it = rest.split_whitespace();
                    let (Some(token), Some(count), None) = (it.next(), it.next(), it.next()) else {
                        return Err(error(path, n, "expected `#unroll $token COUNT`"));
                    };
                    if !token.starts_with('$') {
                        return Err(error(path, n, "an unroll token starts with `$`"));
                    }
                    // A token inside another (`$v` in `$vx`) would expand the other's lines.
                    if let Some((t, _)) = unrolls
                        .iter()
                        .find(|(t, _)| t.starts_with(token) || token.starts_with(t.as_str()))
                    {
                        let e = format!("unroll token {token} overlaps {t}");
                        return Err(error(path, n, e));
                    }
                    let count = match defines.get(count) {
                        Some(Value::U32(c)) => *c,
                        _ => return Err(error(path, n, format!("`{count}` is no u32 define"))),
                    };
                    unrolls.push((token.to_string(), count));
                }
                "include" | "unroll" => {}
                _ => return Err(error(path, n, format!("unknown directive `#{word}`"))),
            }
        }
        if let Some(c) = conds.last() {
            return Err(error(path, c.line, "#if without #endif"));
        }
        Ok(())
    }
}

/// Writes `line`, repeated by each unroll whose token it holds.
fn emit(line: &str, unrolls: &[(String, u32)], out: &mut String) {
    let mut lines = vec![line.to_string()];
    for (token, count) in unrolls {
        lines = lines
            .into_iter()
            .flat_map(|l| {
                if l.contains(token.as_str()) {
                    (0..*count)
                        .map(|i| l.replace(token.as_str(), &i.to_string()))
                        .collect()
                } else {
                    vec![l]
                }
            })
            .collect();
    }
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
}

/// `line` with every use of a name read at run time ([`Value::Uniform`]) in its code (not in a
/// `//` comment, not as a field after `.`) replaced by the name's WGSL expression.
fn read_uniforms(line: &str, uniforms: &[(&str, &'static str)]) -> String {
    if uniforms.is_empty() {
        return line.to_string();
    }
    let (code, comment) = match line.find("//") {
        Some(at) => line.split_at(at),
        None => (line, ""),
    };
    let mut out = String::with_capacity(line.len());
    let mut rest = code;
    let mut after_dot = false;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_alphanumeric() || c == '_' {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..end];
            match uniforms.iter().find(|(n, _)| *n == word) {
                Some((_, expr)) if !after_dot => out.push_str(expr),
                _ => out.push_str(word),
            }
            rest = &rest[end..];
            after_dot = false;
        } else {
            out.push(c);
            after_dot = c == '.';
            rest = &rest[c.len_utf8()..];
        }
    }
    out.push_str(comment);
    out
}

/// `line` with every `{{name}}` replaced by the innermost include parameter of that name.
fn substitute(line: &str, scope: &[(String, String)]) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let end = tail.find("}}").ok_or("`{{` without `}}`")?;
        let name = &tail[..end];
        let value = scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no include parameter `{name}` in scope"))?;
        out.push_str(&value.1);
        rest = &tail[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `"file" name=value ...` of an `#include`.
type Include = (String, Vec<(String, String)>);

fn parse_include(rest: &str) -> std::result::Result<Include, String> {
    let rest = rest
        .strip_prefix('"')
        .ok_or("expected `#include \"file\"`")?;
    let (file, params) = rest.split_once('"').ok_or("unterminated file name")?;
    let params = params
        .split_whitespace()
        .map(|p| {
            p.split_once('=')
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .ok_or_else(|| format!("parameter `{p}` is not name=value"))
        })
        .collect::<std::result::Result<_, _>>()?;
    Ok((file.to_string(), params))
}

/// A condition's value: integers compare, booleans combine.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Term {
    Int(i64),
    Bool(bool),
}

fn evaluate(expr: &str, defines: &Defines) -> std::result::Result<bool, String> {
    let tokens = tokenize(expr)?;
    let mut p = Parser {
        tokens: &tokens,
        at: 0,
        defines,
    };
    let v = p.or()?;
    if p.at != tokens.len() {
        return Err(format!("unexpected `{}` in `{expr}`", tokens[p.at]));
    }
    match v {
        Term::Bool(b) => Ok(b),
        Term::Int(_) => Err(format!("`{expr}` is a number, not a condition")),
    }
}

fn tokenize(expr: &str) -> std::result::Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if ["==", "!=", "<=", ">=", "&&", "||"].contains(&two.as_str()) {
                tokens.push(two);
                i += 2;
            } else if "!<>()".contains(c) {
                tokens.push(c.to_string());
                i += 1;
            } else {
                return Err(format!("unexpected `{c}` in `{expr}`"));
            }
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: &'a [String],
    at: usize,
    defines: &'a Defines,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn boolean(t: Term, op: &str) -> std::result::Result<bool, String> {
        match t {
            Term::Bool(b) => Ok(b),
            Term::Int(_) => Err(format!("`{op}` needs conditions, not numbers")),
        }
    }

    fn or(&mut self) -> std::result::Result<Term, String> {
        let mut v = self.and()?;
        while self.peek() == Some("||") {
            self.at += 1;
            let r = self.and()?;
            v = Term::Bool(Self::boolean(v, "||")? | Self::boolean(r, "||")?);
        }
        Ok(v)
    }

    fn and(&mut self) -> std::result::Result<Term, String> {
        let mut v = self.compare()?;
        while self.peek() == Some("&&") {
            self.at += 1;
            let r = self.compare()?;
            v = Term::Bool(Self::boolean(v, "&&")? & Self::boolean(r, "&&")?);
        }
        Ok(v)
    }

    fn compare(&mut self) -> std::result::Result<Term, String> {
        let a = self.unary()?;
        let Some(op) = self
            .peek()
            .filter(|o| ["==", "!=", "<", "<=", ">", ">="].contains(o))
            .map(str::to_string)
        else {
            return Ok(a);
        };
        self.at += 1;
        let b = self.unary()?;
        let v = match (a, b) {
            (Term::Int(x), Term::Int(y)) => match op.as_str() {
                "==" => x == y,
                "!=" => x != y,
                "<" => x < y,
                "<=" => x <= y,
                ">" => x > y,
                _ => x >= y,
            },
            (Term::Bool(x), Term::Bool(y)) if op == "==" => x == y,
            (Term::Bool(x), Term::Bool(y)) if op == "!=" => x != y,
            _ => return Err(format!("`{op}` compares two numbers or two conditions")),
        };
        Ok(Term::Bool(v))
    }

    fn unary(&mut self) -> std::result::Result<Term, String> {
        if self.peek() == Some("!") {
            self.at += 1;
            let v = self.unary()?;
            return Ok(Term::Bool(!Self::boolean(v, "!")?));
        }
        let t = self.peek().ok_or("a condition ends early")?.to_string();
        self.at += 1;
        if t == "(" {
            let v = self.or()?;
            if self.peek() != Some(")") {
                return Err("`(` without `)`".into());
            }
            self.at += 1;
            return Ok(v);
        }
        if let Some(digits) = t.strip_suffix('u').filter(|d| !d.is_empty()).or(Some(&t))
            && let Ok(n) = digits.parse::<i64>()
        {
            return Ok(Term::Int(n));
        }
        match t.as_str() {
            "true" => return Ok(Term::Bool(true)),
            "false" => return Ok(Term::Bool(false)),
            _ => {}
        }
        match self.defines.get(&t) {
            Some(Value::U32(v)) => Ok(Term::Int(*v as i64)),
            Some(Value::Bool(b)) => Ok(Term::Bool(*b)),
            Some(Value::F32(_)) => Err(format!("`{t}` is an f32: conditions take integers")),
            Some(Value::Uniform(_)) => Err(format!(
                "`{t}` is read at run time: conditions take constants"
            )),
            None => Err(format!("`{t}` is not defined")),
        }
    }
}

/// Every path [`FILES`] lists, for the test that every file under `wgsl/` is one of them.
#[cfg(test)]
pub(crate) fn listed_files() -> Vec<&'static str> {
    FILES.iter().map(|(p, _)| *p).collect()
}

#[cfg(test)]
mod tests {
    use super::{Defines, Value, assemble_from, evaluate, listed_files};

    fn defines() -> Defines {
        let mut d = Defines::default();
        d.constant("G", Value::U32(4));
        d.constant("K_KIND", Value::U32(2));
        d.constant("KIND_TURBO", Value::U32(2));
        d.constant("K_QJL", Value::Bool(false));
        d.switch("ENCODE", true);
        d
    }

    #[test]
    fn conditions_combine_defines_and_numbers() {
        let d = defines();
        let t = |e: &str| evaluate(e, &d).unwrap();
        assert!(t("ENCODE"));
        assert!(t("K_KIND == KIND_TURBO && !K_QJL"));
        assert!(!t("K_KIND != 2u || K_QJL"));
        assert!(t("(G > 3) && (G <= 4)"));
        assert!(t("!(K_QJL || !ENCODE)"));
    }

    #[test]
    fn an_unknown_name_or_a_type_error_is_an_error() {
        let d = defines();
        for bad in [
            "K_KND == 2",
            "G && ENCODE",
            "G",
            "K_KIND ==",
            "(ENCODE",
            "G + 1",
        ] {
            assert!(evaluate(bad, &d).is_err(), "{bad}");
        }
    }

    #[test]
    fn includes_conditions_and_unrolls_expand_in_order() {
        let files = [
            (
                "root.wgsl",
                "#include \"side.wgsl\" side=k\n#if G > 2\nwide\n#elif ENCODE\nnot this\n#else\nnor this\n#endif\n",
            ),
            (
                "side.wgsl",
                "#unroll $g G\n#unroll $x TWO\nfn {{side}}_f() {}\nlet a$g$x = $g;\n#if !ENCODE\n{{nope}} skipped\n#endif\n",
            ),
        ];
        let mut d = defines();
        d.constant("TWO", Value::U32(2));
        let out = assemble_from(&files, "root.wgsl", &d).unwrap();
        let body: Vec<&str> = out
            .lines()
            .filter(|l| !l.starts_with("const "))
            .skip(1)
            .collect();
        let mut want = vec!["fn k_f() {}".to_string()];
        for g in 0..4 {
            for x in 0..2 {
                want.push(format!("let a{g}{x} = {g};"));
            }
        }
        want.push("wide".into());
        assert_eq!(body, want);
        assert!(out.contains("const G: u32 = 4u;\n") && !out.contains("ENCODE"));
    }

    #[test]
    fn malformed_directives_are_errors_that_name_the_line() {
        let d = defines();
        for (text, what) in [
            ("#if ENCODE\n", "root.wgsl:1: #if without #endif"),
            ("#endif\n", "root.wgsl:1: #endif without #if"),
            (
                "#if ENCODE\n#else\n#else\n#endif\n",
                "root.wgsl:3: #else after #else",
            ),
            (
                "#if ENCODE\n#else\n#elif G\n#endif\n",
                "root.wgsl:3: #elif after #else",
            ),
            (
                "#include \"missing.wgsl\"\n",
                "root.wgsl:1: no kvq WGSL file `missing.wgsl`",
            ),
            (
                "#if ENCODE\n#else if G\n#endif\n",
                "root.wgsl:2: text after #else",
            ),
            (
                "#unroll $g G\n#unroll $gx G\n",
                "root.wgsl:2: unroll token $gx overlaps $g",
            ),
            ("#include \"root.wgsl\"\n", "too deep"),
            ("#unroll $g NOPE\n", "root.wgsl:1: `NOPE` is no u32 define"),
            ("#define X 1\n", "root.wgsl:1: unknown directive `#define`"),
            ("{{side}}\n", "root.wgsl:1: no include parameter `side`"),
            (
                "#if K_KND == 2\n#endif\n",
                "root.wgsl:1: `K_KND` is not defined",
            ),
        ] {
            let files = [("root.wgsl", text)];
            let e = assemble_from(&files, "root.wgsl", &d)
                .unwrap_err()
                .to_string();
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn every_wgsl_file_is_listed_once() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/wgsl");
        let mut on_disk = Vec::new();
        for dir in std::fs::read_dir(root).unwrap() {
            let dir = dir.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&dir).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "wgsl") {
                    let rel = f.strip_prefix(root).unwrap();
                    on_disk.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        on_disk.sort();
        let mut listed: Vec<String> = listed_files().iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }
}
