//! docs/architecture.md held to the code: the kinds of open files the
//! image crate defines are all named there, with their count, and every
//! repository path it names exists. The document is read from the source
//! tree, so a moved module or a new kind fails here until the document
//! says so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The workspace root (this crate is one directory below it).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the ckpt crate lies inside the workspace")
        .to_path_buf()
}

/// A file of the workspace, read whole.
fn read(relative: &str) -> String {
    let path = workspace().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The modules `image/src/fd/mod.rs` declares (`pub mod NAME;`).
fn image_fd_modules() -> BTreeSet<String> {
    read("image/src/fd/mod.rs")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod")?.trim().strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// The kinds of open files: the image crate's one list of them.
fn image_file_kinds() -> BTreeSet<String> {
    ckpt_image::fd::KIND_NAMES
        .iter()
        .map(|k| k.to_string())
        .collect()
}

/// The row of docs/architecture.md's crates table for `crate_dir`
/// (`image/`, ...).
fn crate_row<'a>(doc: &'a str, crate_dir: &str) -> &'a str {
    let start = format!("| `{crate_dir}`");
    doc.lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("docs/architecture.md has no crates-table row for {crate_dir}"))
}

/// The paragraph of docs/architecture.md that starts with `opening`.
fn paragraph<'a>(doc: &'a str, opening: &str) -> &'a str {
    let start = doc
        .find(opening)
        .unwrap_or_else(|| panic!("docs/architecture.md has no paragraph {opening:?}"));
    let rest = &doc[start..];
    &rest[..rest.find("\n\n").unwrap_or(rest.len())]
}

/// The spans between backquotes.
fn quoted(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

#[test]
fn the_image_crates_fd_modules_are_listed_with_their_count() {
    let doc = read("docs/architecture.md");
    let row = crate_row(&doc, "image/");
    let kinds = image_file_kinds();
    assert!(kinds.len() >= 17, "kinds read from the code: {kinds:?}");
    let count = format!("one module per kind of file, {}:", kinds.len());
    assert!(
        row.contains(&count),
        "docs/architecture.md, image/ row: says no {count:?}"
    );
    for module in image_fd_modules() {
        assert!(
            row.contains(&format!("`{module}`")),
            "docs/architecture.md, image/ row: does not name image/src/fd/{module}.rs"
        );
    }
}

#[test]
fn the_kinds_of_files_are_listed_with_their_count() {
    let doc = read("docs/architecture.md");
    let kinds = image_file_kinds();
    let modules = image_fd_modules();
    let list = paragraph(&doc, "Kinds of files today");
    assert!(
        list.starts_with(&format!("Kinds of files today ({},", kinds.len())),
        "docs/architecture.md: the kinds list does not give their count, {}",
        kinds.len()
    );
    for kind in &kinds {
        assert!(
            modules.contains(kind),
            "kind `{kind}` has no module in image/src/fd/"
        );
        assert!(
            list.contains(&format!("`{kind}`")),
            "docs/architecture.md: the kinds list does not name `{kind}`"
        );
    }
}

/// A path of the repository as the document writes it: rooted at a
/// top-level directory, without placeholders (`fd_KIND.proto`,
/// `commands/<name>.rs`) or globs.
fn repository_path(word: &str, roots: &BTreeSet<String>) -> Option<String> {
    let word = word.trim_end_matches(['.', ',', ';', ':', ')']);
    let root = word.split('/').next()?;
    let literal = !word.contains(['*', '<', '{', '|'])
        && !word.chars().any(|c| c.is_ascii_uppercase())
        && word.contains('/');
    (literal && roots.contains(root)).then(|| word.to_string())
}

#[test]
fn every_path_named_in_architecture_md_exists() {
    let root = workspace();
    let roots: BTreeSet<String> = std::fs::read_dir(&root)
        .expect("read the workspace")
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != "target" && !n.starts_with('.'))
        .collect();
    let doc = read("docs/architecture.md");
    let mut checked = 0;
    // A path starts a word: after a space, a quote or an opening bracket,
    // never inside another path (`/var/lib/ckpt/...` is not `ckpt/`).
    for word in doc.split([' ', '\n', '`', '(', '[', '"']) {
        if let Some(path) = repository_path(word, &roots) {
            assert!(
                root.join(&path).exists(),
                "docs/architecture.md names {path}, which does not exist"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 20,
        "only {checked} paths found in docs/architecture.md"
    );
}

/// Every file or directory of `crate_dir`, relative to it.
fn files_under(crate_dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![crate_dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name() == "target" {
                continue;
            }
            if path.is_dir() {
                todo.push(path.clone());
            }
            if let Ok(relative) = path.strip_prefix(crate_dir) {
                out.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[test]
fn every_file_a_crate_row_names_exists_in_that_crate() {
    let doc = read("docs/architecture.md");
    let rows: Vec<&str> = doc
        .lines()
        .skip_while(|l| !l.starts_with("## Crates"))
        .skip_while(|l| !l.starts_with("| `"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(rows.len() >= 6, "crates table: {rows:?}");
    for row in rows {
        let crate_dir = quoted(row).next().expect("the row names its crate");
        let files = files_under(&workspace().join(crate_dir));
        // File names (`held.rs`, `pages/direct.rs`) and directories
        // (`fd/`, `run/`) of this crate; placeholders and globs aside.
        for name in quoted(row).skip(1) {
            let is_file = name.ends_with(".rs") || name.ends_with('/');
            if !is_file || name.contains(['*', '<', ' ']) || name.starts_with("ib-state/") {
                continue;
            }
            let name = name.trim_end_matches('/');
            assert!(
                files
                    .iter()
                    .any(|f| f == name || f.ends_with(&format!("/{name}"))),
                "docs/architecture.md, row {crate_dir}: no {name} in {crate_dir}"
            );
        }
    }
}
