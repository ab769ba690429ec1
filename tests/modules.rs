//! The module structure of every crate under `crates/`: no import cycle
//! between the modules (files) of one crate.
//!
//! A module depends on another when it names it or an item of it: a `use`
//! of `crate::…`, `super::…` or `self::…`, or such a path in code or types.
//! Re-exports are followed to where the item is defined (`crate::Error`
//! named through lib.rs's `pub use` is an edge to the module that defines
//! it, and one from lib.rs to that module); declaring a child (`mod x;`)
//! is not a dependency. Test-only modules and items (`#[cfg(test)]`) are
//! left out: tests may reach anywhere. A cycle fails the test with its
//! files, so the fix (a leaf module for what both sides share, or one side
//! taking what it needs as arguments) is obvious.

use oxccl_e2e::tree::rust_files;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// A module path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

/// One crate's modules: which file holds each module (inline modules share
/// their file), what each module re-exports, and each file's references.
#[derive(Default)]
struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
    /// (module, name) → the path it re-exports, as written there.
    reexports: HashMap<(ModPath, String), Vec<String>>,
    /// file → the paths it names, each with the module it is named in.
    refs: BTreeMap<PathBuf, Vec<(ModPath, Vec<String>)>>,
}

fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>().is_ok_and(|m| matches!(&m, syn::Meta::Path(p) if p.is_ident("test")))
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find(|a| a.path().is_ident("path")).and_then(|a| match &a.meta {
        syn::Meta::NameValue(nv) => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// `segs` as named in module `at` (starting with `crate`, `super`,
/// `self` or a child module of `at`), as an absolute module path; `None`
/// for paths outside the crate (other crates, local names).
fn absolute(at: &ModPath, segs: &[String], files: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    let first = segs.first()?;
    let mut base: ModPath = match first.as_str() {
        "crate" => Vec::new(),
        "self" => at.clone(),
        "super" => {
            let mut b = at.clone();
            b.pop()?;
            b
        }
        child => {
            let mut b = at.clone();
            b.push(child.to_string());
            if !files.contains_key(&b) {
                return None;
            }
            b.extend(segs[1..].iter().cloned());
            return Some(b);
        }
    };
    let mut rest = &segs[1..];
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().filter(|s| s.as_str() != "self").cloned());
    Some(base)
}

/// Collects a file's references and its modules' re-exports.
struct Walker<'a> {
    krate: &'a mut Crate,
    file: PathBuf,
    /// The module being walked (inline modules push onto it).
    at: ModPath,
    /// Directory where the current module's children live.
    dir: PathBuf,
    /// Child files still to walk: (module path, file, its children's dir).
    pending: Vec<(ModPath, PathBuf, PathBuf)>,
}

impl Walker<'_> {
    fn note(&mut self, segs: &[String]) {
        if segs.len() > 1 || segs.first().is_some_and(|s| matches!(s.as_str(), "crate" | "self" | "super")) {
            self.krate.refs.entry(self.file.clone()).or_default().push((self.at.clone(), segs.to_vec()));
        }
    }

    /// Every leaf of a `use` tree, as segments; `*` for globs.
    fn leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                Self::leaves(&p.tree, prefix, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut v = prefix.clone();
                v.push(n.ident.to_string());
                out.push((v, n.ident.to_string()));
            }
            syn::UseTree::Rename(r) => {
                let mut v = prefix.clone();
                v.push(r.ident.to_string());
                out.push((v, r.rename.to_string()));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".into())),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    Self::leaves(t, prefix, out);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if test_only(attrs) {
            return;
        }
        syn::visit::visit_item(self, item)
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let name = m.ident.to_string();
        let mut child = self.at.clone();
        child.push(name.clone());
        match &m.content {
            Some((_, items)) => {
                self.krate.files.insert(child.clone(), self.file.clone());
                let (at, dir) = (std::mem::replace(&mut self.at, child), self.dir.clone());
                self.dir = self.dir.join(&name);
                for i in items {
                    self.visit_item(i);
                }
                (self.at, self.dir) = (at, dir);
            }
            None => {
                let file = match path_attr(&m.attrs) {
                    Some(p) => self.file.parent().expect("a file's directory").join(p),
                    None => {
                        let flat = self.dir.join(format!("{name}.rs"));
                        if flat.exists() { flat } else { self.dir.join(&name).join("mod.rs") }
                    }
                };
                assert!(file.exists(), "module {} declared in {} has no file", child.join("::"), self.file.display());
                let dir = if file.ends_with("mod.rs") {
                    file.parent().expect("a directory").to_path_buf()
                } else {
                    file.with_extension("")
                };
                self.pending.push((child, file, dir));
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut out = Vec::new();
        Self::leaves(&u.tree, &mut Vec::new(), &mut out);
        let public = !matches!(u.vis, syn::Visibility::Inherited);
        for (segs, name) in out {
            self.note(&segs);
            if public && name != "*" {
                self.krate.reexports.insert((self.at.clone(), name), segs);
            }
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segs);
        syn::visit::visit_path(self, p)
    }
}

/// Walks a crate from its root file.
fn load(root: &Path) -> Crate {
    let mut krate = Crate::default();
    let dir = root.parent().expect("src").to_path_buf();
    let mut todo = vec![(ModPath::new(), root.to_path_buf(), dir)];
    while let Some((at, file, dir)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if test_only(&ast.attrs) {
            continue;
        }
        krate.files.insert(at.clone(), file.clone());
        let mut w = Walker { krate: &mut krate, file, at, dir, pending: Vec::new() };
        w.visit_file(&ast);
        todo.extend(w.pending);
    }
    krate
}

impl Crate {
    /// The file that defines what `path` names: the longest module prefix,
    /// through re-exports.
    fn resolve(&self, path: &ModPath, depth: usize) -> Option<&PathBuf> {
        let mut k = path.len();
        while !self.files.contains_key(&path[..k]) {
            k -= 1;
        }
        let module = path[..k].to_vec();
        if let Some(name) = path.get(k)
            && depth < 16
            && let Some(segs) = self.reexports.get(&(module.clone(), name.clone()))
            && let Some(mut t) = absolute(&module, segs, &self.files)
            && t != *path
        {
            t.extend(path[k + 1..].iter().cloned());
            return self.resolve(&t, depth + 1);
        }
        self.files.get(&module)
    }

    /// File-level dependency edges.
    fn edges(&self) -> BTreeMap<&PathBuf, BTreeSet<&PathBuf>> {
        let mut g: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
        for (file, refs) in &self.refs {
            for (at, segs) in refs {
                let Some(path) = absolute(at, segs, &self.files) else { continue };
                let Some(to) = self.resolve(&path, 0) else { continue };
                // What an ancestor defines is its children's to use: the
                // parent is their facade.
                let ancestor = self.files.iter().any(|(m, f)| f == to && at.starts_with(m));
                if to != file && !ancestor {
                    g.entry(file).or_default().insert(to);
                }
            }
        }
        g
    }
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles<'a>(g: &BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>) -> Vec<Vec<&'a PathBuf>> {
    struct T<'a, 'g> {
        g: &'g BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>,
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<&'a PathBuf>>,
    }
    impl<'a> T<'a, '_> {
        fn visit(&mut self, v: &'a PathBuf) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for &w in self.g.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t =
        T { g, index: HashMap::new(), low: HashMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for &v in g.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("crates")
}

/// The cycles of the crate whose root file is `root`, as lists of files
/// relative to `base`.
fn crate_cycles(root: &Path, base: &Path) -> Vec<Vec<String>> {
    let krate = load(root);
    let g = krate.edges();
    cycles(&g)
        .into_iter()
        .map(|c| c.into_iter().map(|f| f.strip_prefix(base).unwrap_or(f).display().to_string()).collect::<Vec<_>>())
        .collect()
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let base = crates_dir().canonicalize().expect("crates/");
    let mut found = Vec::new();
    let mut roots = 0;
    for entry in std::fs::read_dir(&base).expect("crates/") {
        let dir = entry.expect("an entry").path();
        let root = dir.join("src").join("lib.rs");
        if !root.exists() {
            continue;
        }
        roots += 1;
        for c in crate_cycles(&root, &base) {
            found.push(c.join(" ↔ "));
        }
    }
    assert!(roots >= 8, "only {roots} crates found under {}", base.display());
    assert!(found.is_empty(), "import cycles between modules:\n  {}", found.join("\n  "));
}

#[test]
fn the_checker_sees_a_cycle_and_resolves_reexports() {
    let dir = std::env::temp_dir().join(format!("oxccl-modules-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    let write = |p: &str, t: &str| std::fs::write(src.join(p), t).unwrap();
    // a → b (through lib.rs's re-export) → b/c → a: one cycle of three
    // files; d uses a but nothing uses d; tests may reach anywhere.
    write("lib.rs", "mod a; mod b; mod d; pub use b::Thing;\n");
    write("a.rs", "use crate::Thing;\npub struct A;\n");
    write("b.rs", "mod c;\npub use c::Thing;\n");
    write("b/c.rs", "pub struct Thing(crate::a::A);\n");
    write("d.rs", "fn f() -> crate::a::A { crate::a::A }\n#[cfg(test)]\nmod tests { use crate::d; }\n");
    let found = crate_cycles(&src.join("lib.rs"), &dir);
    assert_eq!(found, vec![vec!["src/a.rs".to_string(), "src/b/c.rs".to_string()]], "{found:?}");
    // Break it: c no longer names a.
    write("b/c.rs", "pub struct Thing;\n");
    assert!(crate_cycles(&src.join("lib.rs"), &dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One module-file convention: a module with children is a directory with
/// its `mod.rs` (never `x.rs` beside a directory `x/`), in every crate and
/// tool.
#[test]
fn a_module_with_children_is_a_directory_with_its_mod_rs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace");
    let mut files = Vec::new();
    for top in ["crates", "tools"] {
        for e in std::fs::read_dir(root.join(top)).expect("a folder").flatten() {
            rust_files(&e.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 100, "only {} source files found", files.len());
    let beside: Vec<String> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "mod.rs" && n != "lib.rs" && n != "main.rs"))
        .filter(|f| f.with_extension("").is_dir())
        .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
        .collect();
    assert!(beside.is_empty(), "modules with children outside a mod.rs (move x.rs to x/mod.rs): {beside:?}");
}
