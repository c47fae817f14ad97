//! Checkpoint files of the resource managers (upstream `pkg/kubelet/checkpointmanager`):
//! JSON with a `checksum` field that upstream computes as FNV-32a over go-spew's `%#v`
//! rendering of the checkpoint struct with the checksum zeroed. [`Spew`] renders the
//! few Go shapes the checkpoints use (strings, integers, maps, structs, pointers) the way
//! go-spew does with `SortKeys`, so that files written by swiftlet and by the kubelet
//! verify each other.
//!
//! Files are written atomically (temporary file + rename) with mode 0600, as upstream's
//! file store does.

use std::collections::BTreeMap;
use std::path::Path;

/// FNV-32a of `data` (Go's `hash/fnv` `New32a`).
#[must_use]
pub fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The elements of a map, slice or struct between `open` and `close`, separated by
/// spaces, each as `name:value` (`value` alone without a name).
fn write_elements<'a>(
    out: &mut String,
    open: &str,
    elements: impl Iterator<Item = (Option<&'a str>, &'a Spew)>,
    show_type: bool,
    close: char,
) {
    out.push_str(open);
    for (i, (name, v)) in elements.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        if let Some(name) = name {
            out.push_str(name);
            out.push(':');
        }
        v.write(out, show_type);
    }
    out.push(close);
}

/// A Go value as go-spew's formatter renders it with `%#v` (types shown, map keys
/// sorted, keys without their type).
#[derive(Debug, Clone)]
pub enum Spew {
    /// A scalar already written as Go prints it (strings raw, numbers in decimal), with
    /// its Go type (`string`, `uint64`, `checksum.Checksum`).
    Scalar {
        /// The Go type name.
        ty: String,
        /// The value as printed.
        text: String,
    },
    /// A map of string keys; `None` is a nil map (`<nil>`).
    Map {
        /// The Go type name (`map[string]string`).
        ty: String,
        /// The entries; `None` for a nil map.
        entries: Option<BTreeMap<String, Spew>>,
    },
    /// A struct with its fields in declaration order.
    Struct {
        /// The Go type name (`state.CPUManagerCheckpoint`).
        ty: String,
        /// Field name and value, in declaration order.
        fields: Vec<(&'static str, Spew)>,
    },
    /// A non-nil pointer to a value.
    Ptr(Box<Spew>),
    /// A slice; `None` is a nil slice.
    Slice {
        /// The Go type name (`[]int`).
        ty: String,
        /// The elements.
        items: Option<Vec<Spew>>,
    },
}

impl Spew {
    /// A Go `string`.
    #[must_use]
    pub fn string(s: &str) -> Self {
        Self::Scalar { ty: "string".into(), text: s.into() }
    }

    /// A scalar of Go type `ty` printed as `text`.
    #[must_use]
    pub fn scalar(ty: &str, text: impl std::fmt::Display) -> Self {
        Self::Scalar { ty: ty.into(), text: text.to_string() }
    }

    fn ty(&self) -> String {
        match self {
            Self::Scalar { ty, .. } | Self::Map { ty, .. } | Self::Struct { ty, .. } | Self::Slice { ty, .. } => {
                ty.clone()
            }
            Self::Ptr(inner) => format!("*{}", inner.ty()),
        }
    }

    /// The `%#v` rendering.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, true);
        out
    }

    /// go-spew prints a value's type unless its container says not to: map keys and
    /// values and slice elements go without (a pointer there is written `<*>`).
    fn write(&self, out: &mut String, show_type: bool) {
        if show_type {
            out.push('(');
            out.push_str(&self.ty());
            out.push(')');
        } else if matches!(self, Self::Ptr(_)) {
            out.push_str("<*>");
        }
        match self {
            Self::Scalar { text, .. } => out.push_str(text),
            Self::Map { entries: None, .. } | Self::Slice { items: None, .. } => out.push_str("<nil>"),
            Self::Map { entries: Some(entries), .. } => {
                let entries = entries.iter().map(|(k, v)| (Some(k.as_str()), v));
                write_elements(out, "map[", entries, false, ']');
            }
            Self::Slice { items: Some(items), .. } => {
                write_elements(out, "[", items.iter().map(|v| (None, v)), false, ']');
            }
            Self::Struct { fields, .. } => {
                write_elements(out, "{", fields.iter().map(|(name, v)| (Some(*name), v)), true, '}');
            }
            // The pointer's own type was printed; the pointee follows without its type.
            Self::Ptr(inner) => inner.write(out, false),
        }
    }

    /// Upstream's checksum of this value: FNV-32a of the rendering.
    #[must_use]
    pub fn checksum(&self) -> u32 {
        fnv32a(self.render().as_bytes())
    }
}

/// Writes `contents` to `path` atomically (temporary file in the same directory, then
/// rename), mode 0600.
///
/// # Errors
/// The I/O error.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    write_atomic_with_mode(path, contents, 0o600)
}

/// [`write_atomic`] with the file mode `mode`. The temporary file is removed when a step
/// fails.
///
/// # Errors
/// The I/O error.
pub fn write_atomic_with_mode(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    replace(path, contents, mode, true)
}

/// [`write_atomic`] without `fsync`: a reader never sees a partial file and an agent
/// crash loses nothing (the page cache has it), but a machine crash may.
///
/// # Errors
/// The I/O error.
pub fn replace_unsynced(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    replace(path, contents, 0o600, false)
}

fn replace(path: &Path, contents: &[u8], mode: u32, sync: bool) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("checkpoint")));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        f.write_all(contents)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv32a_matches_go() {
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
    }

    #[test]
    fn renders_like_go_spew() {
        let v = Spew::Ptr(Box::new(Spew::Struct {
            ty: "p.T".into(),
            fields: vec![
                ("A", Spew::string("x")),
                (
                    "M",
                    Spew::Map {
                        ty: "map[string]string".into(),
                        entries: Some(BTreeMap::from([
                            ("b".into(), Spew::string("2")),
                            ("a".into(), Spew::string("1")),
                        ])),
                    },
                ),
                ("N", Spew::Map { ty: "map[string]string".into(), entries: None }),
                ("C", Spew::scalar("uint64", 0)),
            ],
        }));
        assert_eq!(
            v.render(),
            "(*p.T){A:(string)x M:(map[string]string)map[a:1 b:2] N:(map[string]string)<nil> C:(uint64)0}"
        );
        let nested = Spew::Map {
            ty: "map[string]*p.U".into(),
            entries: Some(BTreeMap::from([(
                "0".into(),
                Spew::Ptr(Box::new(Spew::Struct {
                    ty: "p.U".into(),
                    fields: vec![(
                        "Cells",
                        Spew::Slice {
                            ty: "[]int".into(),
                            items: Some(vec![Spew::scalar("int", 0), Spew::scalar("int", 1)]),
                        },
                    )],
                })),
            )])),
        };
        assert_eq!(nested.render(), "(map[string]*p.U)map[0:<*>{Cells:([]int)[0 1]}]");
    }
}
