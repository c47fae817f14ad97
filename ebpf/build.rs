//! Compiles the C CO-RE sensors in `bpf/*.bpf.c` into BPF objects in `OUT_DIR`, which
//! `src/loader.rs` embeds. The programs declare the kernel fields they read with
//! `preserve_access_index` instead of including a generated `vmlinux.h`, so the build
//! needs clang and the libbpf headers but no BTF of the build host.
//!
//! Overrides: `CLANG` (compiler), `LLVM_STRIP` (stripper), `BPF_INCLUDE` (extra include
//! directory, e.g. a libbpf checkout's `src/`).

use std::{
    env,
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

fn main() {
    if let Err(error) = run() {
        eprintln!("error: building the eBPF sensors failed: {error:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let bpf_dir = manifest_dir.join("bpf");

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    for var in ["CLANG", "LLVM_STRIP", "BPF_INCLUDE"] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let mut sources = Vec::new();
    for entry in fs::read_dir(&bpf_dir).with_context(|| format!("reading {}", bpf_dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(OsStr::to_str).unwrap_or_default();
        if matches!(path.extension().and_then(OsStr::to_str), Some("c" | "h")) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        if path.extension() == Some(OsStr::new("c")) && name.ends_with(".bpf.c") {
            sources.push(path);
        }
    }
    sources.sort();
    if sources.is_empty() {
        bail!("no *.bpf.c sources in {}", bpf_dir.display());
    }

    let clang = find_tool("CLANG", &["clang", "clang-14", "clang-15", "clang-16", "clang-17", "clang-18", "clang-19"])
        .context("clang not found: install clang (cargo xtask testbed up does), or set CLANG")?;
    let strip = find_tool("LLVM_STRIP", &["llvm-strip", "llvm-strip-14", "llvm-strip-15", "llvm-strip-16"]);
    if strip.is_none() {
        println!("cargo:warning=llvm-strip not found: embedding the BPF objects with their DWARF (~3x larger)");
    }
    let includes = include_dirs()?;

    for source in &sources {
        let stem = source.file_name().and_then(OsStr::to_str).unwrap_or_default().trim_end_matches(".c");
        let object = out_dir.join(format!("{stem}.o"));
        compile(&clang, source, &object, &bpf_dir, &includes)?;
        if let Some(strip) = &strip {
            // -g drops DWARF but keeps .BTF/.BTF.ext, which CO-RE needs.
            run_tool(Command::new(strip).arg("-g").arg(&object), "llvm-strip")?;
        }
    }
    Ok(())
}

fn compile(clang: &Path, source: &Path, object: &Path, bpf_dir: &Path, includes: &[PathBuf]) -> Result<()> {
    let mut cmd = Command::new(clang);
    cmd.args(["-target", "bpf", "-O2", "-g", "-mcpu=v3", "-Wall", "-Werror"])
        .arg(format!("-D__TARGET_ARCH_{}", target_arch_define()?))
        .arg("-I")
        .arg(bpf_dir);
    for dir in includes {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-c").arg(source).arg("-o").arg(object);
    run_tool(&mut cmd, "clang")
}

/// `bpf/bpf_helpers.h` (libbpf-dev) and the uapi headers, whose `asm/` lives in the
/// multiarch directory that clang does not search for `-target bpf`.
fn include_dirs() -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some(extra) = env::var_os("BPF_INCLUDE") {
        dirs.push(PathBuf::from(extra));
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH")?;
    let multiarch = PathBuf::from(format!("/usr/include/{arch}-linux-gnu"));
    if multiarch.join("asm").is_dir() {
        dirs.push(multiarch);
    } else if !Path::new("/usr/include/asm").is_dir() {
        bail!("no asm/ uapi headers in {} or /usr/include: install linux-libc-dev", multiarch.display());
    }
    let has_libbpf = dirs.iter().chain([&PathBuf::from("/usr/include")]).any(|d| d.join("bpf/bpf_helpers.h").is_file());
    if !has_libbpf {
        bail!("bpf/bpf_helpers.h not found: install libbpf-dev (cargo xtask testbed up does), or set BPF_INCLUDE");
    }
    Ok(dirs)
}

fn target_arch_define() -> Result<&'static str> {
    Ok(match env::var("CARGO_CFG_TARGET_ARCH")?.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        "riscv64" => "riscv",
        "s390x" => "s390",
        "powerpc64" => "powerpc",
        other => bail!("no BPF target arch mapping for {other}"),
    })
}

/// The first candidate that runs, `$VAR` first.
fn find_tool(var: &str, candidates: &[&str]) -> Option<PathBuf> {
    let from_env = env::var_os(var).map(PathBuf::from);
    from_env
        .into_iter()
        .chain(candidates.iter().map(PathBuf::from))
        .find(|tool| Command::new(tool).arg("--version").output().is_ok_and(|output| output.status.success()))
}

fn run_tool(cmd: &mut Command, name: &str) -> Result<()> {
    let output = cmd.output().with_context(|| format!("running {name}"))?;
    if !output.status.success() {
        bail!(
            "{name} failed ({}): {cmd:?}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
