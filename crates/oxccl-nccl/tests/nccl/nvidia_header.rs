//! oxccl's `include/nccl.h` against NVIDIA's own, of the same version (the
//! `nvidia-nccl-cu13` wheel on PyPI; `.ci/nvidia-nccl-h` fetches its header
//! into `target/nvidia-nccl/nccl.h`, or `OXCCL_NCCL_H` names one).
//!
//! Both headers are read as the C compiler reads them (`cc -E`; NVIDIA's
//! with the stand-in CUDA headers of `tests/c/cuda_stub`), and must declare
//! the same types, struct fields, enumerators, `NCCL_*` macros and
//! functions, but for the differences [`NVIDIA_ONLY`] and [`OXCCL_ONLY`]
//! list with their reasons (a new one either way fails). Then one C program,
//! compiled once against each header, prints every type's size, every
//! field's offset and size, every enumerator's and macro's value (with its
//! C type) and every field each `*_INITIALIZER` sets, and the two outputs
//! must be equal; and each of NVIDIA's function declarations must compile
//! beside oxccl's (C refuses a redeclaration of another type).
//!
//! Without NVIDIA's header (or a C compiler) the test says so and passes,
//! unless `OXCCL_REQUIRE_NCCL_H` (or `OXCCL_REQUIRE_CC`) is set, as CI does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What NVIDIA's header declares and oxccl's does not, each with why
/// (`"function ncclX"`, `"type T"`, `"field T.f"`, `"enumerator E"`,
/// `"macro M"`). Empty: oxccl declares all of NCCL 2.32.3's API.
const NVIDIA_ONLY: &[(&str, &str)] = &[];

/// What oxccl's header declares beyond NVIDIA's (named as in
/// [`NVIDIA_ONLY`]), each with why. Its own additions are named `OXCCL_*`
/// and are not compared.
const OXCCL_ONLY: &[(&str, &str)] = &[
    ("type cudaStream_t", "the CUDA runtime's: oxccl's header declares it where <cuda_runtime.h> is absent"),
    ("type cudaEvent_t", "the CUDA runtime's: oxccl's header declares it where <cuda_runtime.h> is absent"),
];

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// NVIDIA's nccl.h: `OXCCL_NCCL_H`, else where `.ci/nvidia-nccl-h` puts it.
fn nvidia_header() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OXCCL_NCCL_H") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "OXCCL_NCCL_H names {}, which is not a file", p.display());
        return Some(p);
    }
    let known = here().join("../../target/nvidia-nccl/nccl.h");
    if known.is_file() {
        return Some(known);
    }
    let why = format!(
        "NVIDIA's nccl.h was not found: set OXCCL_NCCL_H to it, or run .ci/nvidia-nccl-h (which puts it at {})",
        known.display()
    );
    oxccl_skip::skip_or_fail("OXCCL_REQUIRE_NCCL_H", why);
    None
}

fn cc() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    if let Err(e) = Command::new(&cc).arg("--version").output() {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_CC", format!("no C compiler ({cc}: {e})"));
        return None;
    }
    Some(cc)
}

/// How to compile against one of the two headers.
struct Side {
    name: &'static str,
    header: PathBuf,
    flags: Vec<String>,
}

impl Side {
    fn nvidia(header: PathBuf) -> Side {
        let header = header.canonicalize().unwrap();
        let dir = header.parent().unwrap().display().to_string();
        let stub = here().join("tests/c/cuda_stub").display().to_string();
        Side { name: "NVIDIA's", header, flags: vec!["-I".into(), stub, "-I".into(), dir] }
    }

    fn oxccl() -> Side {
        let header = here().join("include/nccl.h").canonicalize().unwrap();
        let dir = header.parent().unwrap().display().to_string();
        Side { name: "oxccl's", header, flags: vec!["-DOXCCL_NO_CUDA_RUNTIME".into(), "-I".into(), dir] }
    }

    fn cmd(&self, cc: &str) -> Command {
        let mut c = Command::new(cc);
        c.arg("-std=gnu11").args(&self.flags);
        c
    }

    /// What the header declares, as the compiler reads it.
    fn api(&self, cc: &str) -> Api {
        // Declarations: the header's own lines (line markers say which),
        // with NCCL_OS_LINUX defined so that every declaration is seen.
        let text = output(self.cmd(cc).args(["-E", "-DNCCL_OS_LINUX"]).arg(&self.header), self.name);
        let file = format!("\"{}\"", self.header.display());
        let mut own = String::new();
        let mut in_header = false;
        for line in text.lines() {
            if let Some(marker) = line.strip_prefix("# ") {
                in_header = marker.split_whitespace().nth(1) == Some(file.as_str());
            } else if in_header && !line.starts_with('#') {
                own.push_str(line);
                own.push('\n');
            }
        }
        let mut api = Api::default();
        api.declarations(&tokens(&own));
        // Macros, as a program that includes the header sees them.
        let defs = output(self.cmd(cc).args(["-E", "-dM"]).arg(&self.header), self.name);
        for line in defs.lines() {
            let Some(def) = line.strip_prefix("#define ") else { continue };
            let name_end = def.find([' ', '(']).unwrap_or(def.len());
            let name = &def[..name_end];
            if !(name.starts_with("NCCL_") || name.starts_with("nccl") || name.starts_with("pnccl")) {
                continue;
            }
            api.macros.insert(name.to_string(), def[name_end..].to_string());
        }
        api
    }
}

/// Runs `cmd`, which must succeed; its stdout.
fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed on {what} header:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// C tokens (identifiers, numbers, literals, one-character punctuation),
/// `__attribute__((…))` dropped.
fn tokens(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        } else if c.is_ascii_alphanumeric() || c == b'_' {
            // A number takes its point and suffix (1.0f), a name neither.
            let number = c.is_ascii_digit();
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || (number && b[i] == b'.')) {
                i += 1;
            }
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            i += 1;
        }
        out.push(text[start..i.min(b.len())].to_string());
    }
    // Attributes (NVIDIA marks deprecated functions) are not the API.
    let mut kept = Vec::new();
    let mut it = out.into_iter().peekable();
    while let Some(t) = it.next() {
        if t == "__attribute__" {
            let mut depth = 0;
            for u in it.by_ref() {
                depth += (u == "(") as i32 - (u == ")") as i32;
                if depth == 0 {
                    break;
                }
            }
        } else {
            kept.push(t);
        }
    }
    kept
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}

/// `toks` split at `sep` where no bracket is open.
fn split<'a>(toks: &'a [String], sep: &str) -> Vec<&'a [String]> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, t) in toks.iter().enumerate() {
        match t.as_str() {
            "(" | "{" | "[" => depth += 1,
            ")" | "}" | "]" => depth -= 1,
            s if s == sep && depth == 0 => {
                parts.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&toks[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The index of the bracket closing the one at `open`.
fn closing(toks: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate().skip(open) {
        depth += matches!(t.as_str(), "(" | "{" | "[") as i32 - matches!(t.as_str(), ")" | "}" | "]") as i32;
        if depth == 0 {
            return i;
        }
    }
    panic!("unbalanced brackets in {toks:?}")
}

/// The name a declarator declares (`*p`, `a[4]`, `(*f)(int)`).
fn declarator_name(d: &[String]) -> String {
    if let Some(open) = d.iter().position(|t| t == "(") {
        // A function pointer: the name inside the first parentheses.
        return d[open..].iter().find(|t| is_ident(t)).expect("a named function pointer").clone();
    }
    assert!(!d.iter().any(|t| t == ":"), "bit-fields are new in nccl.h: teach nvidia_header.rs to compare them");
    let end = d.iter().position(|t| t == "[").unwrap_or(d.len());
    d[..end].iter().rev().find(|t| is_ident(t)).expect("a named declarator").clone()
}

/// What a header declares.
#[derive(Default)]
struct Api {
    /// Typedef names.
    types: BTreeSet<String>,
    /// Each struct's (or union's) fields, nested ones as `outer.inner`.
    fields: BTreeMap<String, Vec<String>>,
    enumerators: BTreeSet<String>,
    /// Each function's declaration.
    functions: BTreeMap<String, String>,
    /// `NCCL_*`, `nccl*` and `pnccl*` macros: name → what follows it.
    macros: BTreeMap<String, String>,
}

impl Api {
    fn declarations(&mut self, toks: &[String]) {
        for stmt in split(toks, ";") {
            if stmt[0] == "typedef" {
                self.typedef(&stmt[1..]);
            } else if let Some(open) = stmt.iter().position(|t| t == "(") {
                assert!(!stmt.iter().any(|t| t == "{"), "a function body in nccl.h: {}", stmt.join(" "));
                let name = &stmt[open - 1];
                self.functions.insert(name.clone(), stmt.join(" ") + ";");
            } else {
                panic!("nvidia_header.rs does not know this kind of declaration: {}", stmt.join(" "));
            }
        }
    }

    fn typedef(&mut self, t: &[String]) {
        let Some(open) = t.iter().position(|x| x == "{") else {
            self.types.insert(declarator_name(t));
            return;
        };
        let close = closing(t, open);
        let name = t[close + 1..].iter().rev().find(|x| is_ident(x)).expect("a typedef name").clone();
        match t[0].as_str() {
            "enum" => {
                for e in split(&t[open + 1..close], ",") {
                    self.enumerators.insert(e[0].clone());
                }
            }
            "struct" | "union" => {
                let mut fields = Vec::new();
                members(&t[open + 1..close], "", &mut fields);
                self.fields.insert(name.clone(), fields);
            }
            k => panic!("typedef {k} … {{: not a struct, union or enum"),
        }
        self.types.insert(name);
    }

    /// Every name, as `"<kind> <name>"`.
    fn names(&self) -> BTreeSet<String> {
        let mut all = BTreeSet::new();
        all.extend(self.types.iter().map(|t| format!("type {t}")));
        for (t, fs) in &self.fields {
            all.extend(fs.iter().map(|f| format!("field {t}.{f}")));
        }
        all.extend(self.enumerators.iter().map(|e| format!("enumerator {e}")));
        all.extend(self.functions.keys().map(|f| format!("function {f}")));
        all.extend(self.macros.keys().map(|m| format!("macro {m}")));
        all
    }
}

/// The fields of a struct or union body, nested ones after their parent.
fn members(body: &[String], prefix: &str, out: &mut Vec<String>) {
    for m in split(body, ";") {
        if let Some(open) = m.iter().position(|x| x == "{") {
            let close = closing(m, open);
            match m[close + 1..].iter().find(|x| is_ident(x)) {
                Some(name) => {
                    out.push(format!("{prefix}{name}"));
                    members(&m[open + 1..close], &format!("{prefix}{name}."), out);
                }
                // An anonymous member: its fields are the parent's.
                None => members(&m[open + 1..close], prefix, out),
            }
        } else {
            for d in split(m, ",") {
                out.push(format!("{prefix}{}", declarator_name(d)));
            }
        }
    }
}

/// The C program that prints every value both headers fix: a line
/// `key<TAB>kind value` each.
fn program(api: &Api, common: &BTreeSet<String>) -> String {
    let mut c = String::from(
        r#"#include <stddef.h>
#include <stdio.h>
#include "nccl.h"
static void pi(const char* k, long long v) { printf("%s\tint %lld\n", k, v); }
static void pu(const char* k, unsigned long long v) { printf("%s\tunsigned %llu\n", k, v); }
static void pf(const char* k, double v) { printf("%s\tfloat %.17g\n", k, v); }
static void ps(const char* k, const char* v) { printf("%s\tstring \"%s\"\n", k, v ? v : "(null)"); }
static void pp(const char* k, const void* v) { printf("%s\tpointer %p\n", k, v); }
#define PV(k, x) _Generic((x), _Bool: pi, char: pi, signed char: pi, unsigned char: pu, short: pi, \
    unsigned short: pu, int: pi, unsigned int: pu, long: pi, unsigned long: pu, long long: pi, \
    unsigned long long: pu, float: pf, double: pf, char*: ps, const char*: ps, default: pp)(k, x)
int main(void) {
"#,
    );
    let has = |kind: &str, name: &str| common.contains(&format!("{kind} {name}"));
    for t in api.types.iter().filter(|t| has("type", t)) {
        c += &format!("  PV(\"sizeof {t}\", sizeof({t}));\n");
        for f in api.fields.get(t).into_iter().flatten().filter(|f| has("field", &format!("{t}.{f}"))) {
            c += &format!("  PV(\"offsetof {t}.{f}\", offsetof({t}, {f}));\n");
            c += &format!("  PV(\"sizeof {t}.{f}\", sizeof((({t}*)0)->{f}));\n");
        }
    }
    for e in api.enumerators.iter().filter(|e| has("enumerator", e)) {
        c += &format!("  PV(\"enumerator {e}\", {e});\n");
    }
    for (m, raw) in api.macros.iter().filter(|(m, _)| has("macro", m)) {
        let body = raw.trim();
        if as_text(raw) {
            continue;
        }
        if body.starts_with('{') {
            // An initializer: `{ sizeof(T), … }` sets a T; every field it sets.
            let toks = tokens(body);
            assert!(toks[1] == "sizeof" && toks[2] == "(", "{m} does not start with sizeof(its type)");
            let ty = &toks[3];
            c += &format!("  {{ {ty} v = {m};\n");
            let fields = &api.fields[ty];
            let leaves = fields.iter().filter(|f| !fields.iter().any(|g| g.starts_with(&format!("{f}."))));
            for f in leaves {
                c += &format!("    PV(\"init {m}.{f}\", v.{f});\n");
            }
            c += "  }\n";
        } else {
            c += &format!("  PV(\"macro {m}\", {m});\n");
        }
    }
    c + "  return 0;\n}\n"
}

/// Whether a macro is compared as text, not by value: function-like (what
/// follows its name starts with its parameters) or empty.
fn as_text(raw: &str) -> bool {
    raw.starts_with('(') || raw.trim().is_empty()
}

/// `key → kind value` from the program's output.
fn values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn scratch() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nvidia-header-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn build_and_run(cc: &str, side: &Side, src: &Path, dir: &Path) -> BTreeMap<String, String> {
    let exe = dir.join(format!("layout-{}", if side.name.starts_with('N') { "nvidia" } else { "oxccl" }));
    output(side.cmd(cc).arg(src).arg("-o").arg(&exe), side.name);
    values(&output(&mut Command::new(&exe), side.name))
}

#[test]
fn the_header_is_nvidias_own_in_sizes_offsets_values_and_functions() {
    let Some(nvidia) = nvidia_header() else { return };
    let Some(cc) = cc() else { return };
    let (nv_side, ox_side) = (Side::nvidia(nvidia), Side::oxccl());
    let (nv, ox) = (nv_side.api(&cc), ox_side.api(&cc));
    assert_eq!(
        nv.macros.get("NCCL_VERSION_CODE"),
        ox.macros.get("NCCL_VERSION_CODE"),
        "{} is another version of NCCL than oxccl's header implements: fetch that one (.ci/nvidia-nccl-h)",
        nv_side.header.display()
    );
    assert!(nv.functions.len() >= 70 && nv.types.len() >= 15, "too little found in {}", nv_side.header.display());

    // The same names, but for the listed differences.
    let (nv_names, ox_names) = (nv.names(), ox.names());
    let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| a.difference(b).cloned().collect::<BTreeSet<_>>();
    let listed = |l: &[(&str, &str)]| l.iter().map(|(n, _)| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        only(&nv_names, &ox_names),
        listed(NVIDIA_ONLY),
        "what NVIDIA's header declares and oxccl's does not (left) must be NVIDIA_ONLY (right), each with its reason"
    );
    assert_eq!(
        only(&ox_names, &nv_names),
        listed(OXCCL_ONLY),
        "what oxccl's header declares and NVIDIA's does not (left) must be OXCCL_ONLY (right)"
    );
    let common: BTreeSet<String> = nv_names.intersection(&ox_names).cloned().collect();

    // Function-like and empty macros: the same text.
    for (m, raw) in nv.macros.iter().filter(|(m, _)| common.contains(&format!("macro {m}"))) {
        if as_text(raw) || as_text(&ox.macros[m]) {
            assert_eq!(tokens(raw), tokens(&ox.macros[m]), "macro {m}");
        }
    }

    // Sizes, offsets, values: one program, built against each header.
    let dir = scratch();
    let src = dir.join("layout.c");
    let prog = program(&nv, &common);
    std::fs::write(&src, &prog).unwrap();
    let (want, got) = (build_and_run(&cc, &nv_side, &src, &dir), build_and_run(&cc, &ox_side, &src, &dir));
    assert!(want.len() > 200, "only {} values printed:\n{prog}", want.len());
    let differ: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: NVIDIA {v}, oxccl {}", got.get(k).map_or("(none)", |s| s.as_str())))
        .collect();
    assert!(differ.is_empty(), "oxccl's nccl.h differs from NVIDIA's:\n{}", differ.join("\n"));

    // Signatures: every NVIDIA declaration beside oxccl's header (C refuses
    // conflicting redeclarations).
    let sig = dir.join("signatures.c");
    let mut text = String::from("#include \"nccl.h\"\n");
    for (f, decl) in nv.functions.iter().filter(|(f, _)| common.contains(&format!("function {f}"))) {
        text += &format!("/* {f} */ {decl}\n");
    }
    std::fs::write(&sig, text).unwrap();
    output(ox_side.cmd(&cc).args(["-fsyntax-only", "-Werror", "-DNCCL_OS_LINUX"]).arg(&sig), "oxccl's");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn declarations_are_read_as_c_declares_them() {
    let toks = tokens(
        "typedef struct ncclX_v1 { size_t size; const char* name; int a, *b; struct { int k; } key; \
         union { int i; void* p; }; char id[16]; void (*cb)(int); } ncclX_t; \
         typedef enum { ncclA = 0, ncclB = 1 << 2, ncclC } ncclE_t; typedef struct ncclComm* ncclComm_t; \
         __attribute__ ((deprecated(\"no\"))) void ncclOld(); ncclResult_t pncclF(int x, int (*g)(void));",
    );
    let mut api = Api::default();
    api.declarations(&toks);
    let want = ["size", "name", "a", "b", "key", "key.k", "i", "p", "id", "cb"];
    assert_eq!(api.fields["ncclX_t"], want);
    assert_eq!(api.enumerators, ["ncclA", "ncclB", "ncclC"].map(String::from).into());
    assert_eq!(api.types, ["ncclComm_t", "ncclE_t", "ncclX_t"].map(String::from).into());
    assert_eq!(api.functions.keys().collect::<Vec<_>>(), ["ncclOld", "pncclF"]);
    assert_eq!(api.functions["ncclOld"], "void ncclOld ( );");
}
