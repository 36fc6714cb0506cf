//! `cargo xtask gpu-bundle`: what a GPU machine without Rust or network needs to run burn-llm's
//! GPU test suite and GPU benchmarks, packed into one folder small enough to carry there.
//!
//! Builds in release with `vulkan` (plus the default `wgpu`; one `cargo build --all-targets`) the
//! test binaries of the GPU suite, examples and this xtask binary (for the benchmarks), strips
//! them, downloads the Vulkan
//! loader packages (`apt-get download`, amd64), and packs them with the test fixtures and
//! `scripts/hf_generate_bench.py` into one solid `tar` + `xz` archive: the binaries share most
//! of their code (Burn, CubeCL, wgpu), so a dictionary spanning several of them stores it about
//! once. Beside the archive: `run.sh` (from `scripts/gpu_run.sh`), which unpacks it, installs the
//! loaders and runs the suite and the benchmarks, and `MANIFEST.json` (what is inside, from which
//! commit). The folder is replaced only once the new bundle is complete.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

/// Test binaries the GPU suite runs: cargo target (kind, name), and the file name in the bundle.
const TEST_BINARIES: [(&str, &str, &str); 2] =
    [("lib", "burn_llm_kernels", "kernels-tests"), ("test", "all", "burn-llm-tests")];

/// The Vulkan (and GL/EGL, for wgpu's fallbacks) loader packages the GPU machine lacks.
const LOADER_PACKAGES: [&str; 7] =
    ["libvulkan1", "libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0", "libgles2"];

/// apt options that fetch amd64 packages whatever this machine's architecture, with package
/// lists kept apart from the system's.
fn apt_options(lists: &Path) -> Vec<String> {
    vec![
        "-oAPT::Architecture=amd64".into(),
        "-oAPT::Architectures=amd64".into(),
        format!("-oDir::State::Lists={}", lists.display()),
    ]
}

/// Flags of `gpu-bundle`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder to write the bundle to (relative paths are from the workspace root).
    #[arg(long, default_value = "gpu-bundle")]
    out: PathBuf,
    /// A folder of loader packages (`*.deb`) to pack instead of downloading them.
    #[arg(long)]
    debs: Option<PathBuf>,
    /// Examples to pack (the GPU run itself uses only the test binaries and xtask; every
    /// example adds about 110 MiB before compression, and the device tool carries the bundle
    /// and the working tree within 64 MiB together).
    #[arg(long, value_delimiter = ',', default_value = "llama_generate")]
    examples: Vec<String>,
    /// LZMA dictionary size in MiB: the window within which repeated code compresses away.
    #[arg(long, default_value_t = 256)]
    dict_mib: u32,
    /// xz preset (0–9; higher is smaller and slower).
    #[arg(long, default_value_t = 6)]
    xz_preset: u32,
    /// Largest bundle accepted in MiB (the device tool carries 64 MiB, working tree included).
    #[arg(long, default_value_t = 48)]
    max_mib: u64,
}

/// A file of the bundle and its size.
#[derive(Serialize)]
struct Entry {
    path: String,
    bytes: u64,
}

/// `MANIFEST.json`: what the bundle holds and where it came from.
#[derive(Serialize)]
struct Manifest {
    /// The commit built (with `-dirty` when tracked files had changes).
    commit: String,
    /// Cargo features of the build.
    features: &'static str,
    /// Seconds since the Unix epoch.
    built_unix_time: u64,
    /// Seconds spent building, stripping and packing.
    build_s: f64,
    strip_s: f64,
    pack_s: f64,
    /// The archive's contents before compression.
    payload: Vec<Entry>,
    payload_bytes: u64,
    archive_bytes: u64,
}

/// Something that stopped the bundle.
#[derive(Debug)]
enum BundleError {
    /// A tool ran and failed.
    Command { command: String, status: String, hint: &'static str },
    /// A tool could not be started.
    Spawn { command: String, source: std::io::Error, hint: &'static str },
    /// A binary of the bundle was not built.
    MissingBinary(String),
    /// No loader packages to pack.
    NoDebs(PathBuf),
    /// The bundle would not fit in what the device tool carries.
    TooLarge { got: f64, max: u64 },
}

impl std::fmt::Display for BundleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Command { command, status, hint } => write!(f, "`{command}` failed ({status}): {hint}"),
            Self::Spawn { command, source, hint } => write!(f, "could not start `{command}`: {source}: {hint}"),
            Self::MissingBinary(name) => {
                write!(f, "the build produced no `{name}` executable: is the target (or example) in the workspace?")
            }
            Self::NoDebs(dir) => write!(
                f,
                "no .deb packages in {}: download them (omit --debs) or point --debs at the folder that holds them",
                dir.display()
            ),
            Self::TooLarge { got, max } => write!(
                f,
                "the bundle is {got:.1} MiB, more than the {max} MiB that can be carried: pack fewer binaries or \
                 raise --dict-mib"
            ),
        }
    }
}

impl std::error::Error for BundleError {}

/// Runs `cmd`, its output shown, and fails with `hint` unless it succeeds.
fn run_command(cmd: &mut Command, hint: &'static str) -> Result<(), BundleError> {
    let command = format!("{cmd:?}");
    let status = cmd.status().map_err(|source| BundleError::Spawn { command: command.clone(), source, hint })?;
    if status.success() { Ok(()) } else { Err(BundleError::Command { command, status: status.to_string(), hint }) }
}

/// The workspace root (this crate's parent folder).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// An executable cargo built: its target's kind and name, whether it is a test harness, where.
struct Built {
    kind: String,
    name: String,
    test: bool,
    path: PathBuf,
}

/// Runs cargo (`args` plus the release/vulkan flags) and lists the executables it reports.
fn cargo_executables(root: &Path, args: &[&str]) -> Result<Vec<Built>, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root)
        .args(args)
        .args(["--release", "--workspace", "--features", "vulkan,autotune", "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped());
    let command = format!("{cmd:?}");
    let hint = "see the compiler's messages above";
    let mut child = cmd.spawn().map_err(|source| BundleError::Spawn { command: command.clone(), source, hint })?;
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line?) else { continue };
            let (Some("compiler-artifact"), Some(exe)) = (msg["reason"].as_str(), msg["executable"].as_str()) else {
                continue;
            };
            out.push(Built {
                kind: msg["target"]["kind"][0].as_str().unwrap_or_default().to_string(),
                name: msg["target"]["name"].as_str().unwrap_or_default().to_string(),
                test: msg["profile"]["test"].as_bool().unwrap_or(false),
                path: PathBuf::from(exe),
            });
        }
    }
    let status = child.wait()?;
    if !status.success() {
        return Err(BundleError::Command { command, status: status.to_string(), hint }.into());
    }
    Ok(out)
}

/// The executables of the bundle, as (name in the bundle, built file): the GPU suite's test
/// binaries, the `examples` asked for and xtask.
fn select(built: &[Built], examples: &[String]) -> Result<Vec<(String, PathBuf)>, BundleError> {
    let find = |kind: &str, name: &str, test: bool| {
        built
            .iter()
            .find(|b| b.test == test && b.kind == kind && b.name == name)
            .map(|b| b.path.clone())
            .ok_or_else(|| BundleError::MissingBinary(name.to_string()))
    };
    let mut out = Vec::new();
    for (kind, name, bundled) in TEST_BINARIES {
        out.push((bundled.to_string(), find(kind, name, true)?));
    }
    for example in examples {
        out.push((example.clone(), find("example", example, false)?));
    }
    out.push(("xtask".into(), find("bin", "xtask", false)?));
    Ok(out)
}

/// Copies `from` into the folder `to`, recursively.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Every file under `dir`, relative to `base`, with its size, sorted.
fn list_files(base: &Path, dir: &Path, out: &mut Vec<Entry>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            list_files(base, &entry.path(), out)?;
        } else {
            let path = entry.path();
            let rel = path.strip_prefix(base).unwrap_or(&path).to_string_lossy().into_owned();
            out.push(Entry { path: rel, bytes: entry.metadata()?.len() });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(())
}

/// Downloads [`LOADER_PACKAGES`] into `dir` with apt-get (the device tool's recipe).
fn download_debs(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let lists = std::env::temp_dir().join("burn-llm-gpu-bundle-apt-lists");
    std::fs::create_dir_all(lists.join("partial"))?;
    std::fs::create_dir_all(dir)?;
    let hint = "apt-get needs network access to the Debian/Ubuntu archive; or pass --debs with the packages";
    run_command(Command::new("apt-get").args(apt_options(&lists)).arg("update"), hint)?;
    run_command(
        Command::new("apt-get").current_dir(dir).args(apt_options(&lists)).arg("download").args(LOADER_PACKAGES),
        hint,
    )?;
    Ok(())
}

/// Packs `staging` into `archive` as one solid xz stream (`preset`, `dict_mib` dictionary).
fn pack(staging: &Path, archive: &Path, preset: u32, dict_mib: u32) -> Result<(), Box<dyn std::error::Error>> {
    let file = std::fs::File::create(archive)?;
    let hint = "tar and xz (xz-utils) must be installed";
    // Binaries first and next to each other, so their shared code falls inside one dictionary.
    let mut tar = Command::new("tar");
    tar.arg("-C").arg(staging).args([
        "--sort=name",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "-cf",
        "-",
        "bin",
        "debs",
    ]);
    tar.args(["fixtures", "hf_generate_bench.py", "MANIFEST.json"]).stdout(Stdio::piped());
    let tar_cmd = format!("{tar:?}");
    let mut tar_child = tar.spawn().map_err(|source| BundleError::Spawn { command: tar_cmd.clone(), source, hint })?;
    let tar_out = tar_child.stdout.take().ok_or("tar gave no output pipe")?;
    let mut xz = Command::new("xz");
    xz.args(["-T1", "-c", &format!("--lzma2=preset={preset},dict={dict_mib}MiB")]).stdin(tar_out).stdout(file);
    run_command(&mut xz, hint)?;
    let status = tar_child.wait()?;
    if !status.success() {
        return Err(BundleError::Command { command: tar_cmd, status: status.to_string(), hint }.into());
    }
    Ok(())
}

/// The commit of the workspace, `-dirty` when tracked files changed.
fn commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).filter(|h| !h.is_empty()).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let root = workspace_root();
    let out = root.join(&args.out);
    let staging = PathBuf::from(format!("{}.staging", out.display()));
    let next = PathBuf::from(format!("{}.tmp", out.display()));
    for dir in [&staging, &next] {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
    }

    let started = Instant::now();
    // One invocation for test harnesses, examples and binaries: the features are then unified
    // once (dev-dependencies included), as `cargo test` does, so nothing is built twice.
    eprintln!("building the test binaries, examples and xtask (release, --features vulkan,autotune)…");
    let built = cargo_executables(&root, &["build", "--all-targets"])?;
    let build_s = started.elapsed().as_secs_f64();

    let started = Instant::now();
    std::fs::create_dir_all(staging.join("bin"))?;
    for (name, path) in select(&built, &args.examples)? {
        let target = staging.join("bin").join(&name);
        run_command(
            Command::new("strip").arg("--strip-all").arg("-o").arg(&target).arg(&path),
            "binutils' strip is needed",
        )?;
        eprintln!("{name}: {:.1} MiB → {:.1} MiB stripped", mib(path.metadata()?.len()), mib(target.metadata()?.len()));
    }
    let strip_s = started.elapsed().as_secs_f64();

    let debs = staging.join("debs");
    match &args.debs {
        Some(dir) => copy_dir(dir, &debs)?,
        None => download_debs(&debs)?,
    }
    let has_deb = std::fs::read_dir(&debs)?.flatten().any(|e| e.path().extension().is_some_and(|x| x == "deb"));
    if !has_deb {
        return Err(BundleError::NoDebs(args.debs.unwrap_or(debs)).into());
    }
    copy_dir(&root.join("tests/fixtures"), &staging.join("fixtures"))?;
    std::fs::copy(root.join("scripts/hf_generate_bench.py"), staging.join("hf_generate_bench.py"))?;

    let started = Instant::now();
    let mut payload = Vec::new();
    list_files(&staging, &staging, &mut payload)?;
    let mut manifest = Manifest {
        commit: commit(&root),
        features: "vulkan,wgpu,autotune (release)",
        built_unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs())?,
        build_s,
        strip_s,
        pack_s: 0.0,
        payload_bytes: payload.iter().map(|e| e.bytes).sum(),
        payload,
        archive_bytes: 0,
    };
    std::fs::write(staging.join("MANIFEST.json"), serde_json::to_string_pretty(&manifest)?)?;
    std::fs::create_dir_all(&next)?;
    let archive = next.join("payload.tar.xz");
    eprintln!(
        "packing {:.1} MiB (xz preset {}, {} MiB dictionary)…",
        mib(manifest.payload_bytes),
        args.xz_preset,
        args.dict_mib
    );
    pack(&staging, &archive, args.xz_preset, args.dict_mib)?;
    manifest.pack_s = started.elapsed().as_secs_f64();
    manifest.archive_bytes = archive.metadata()?.len();
    std::fs::write(next.join("MANIFEST.json"), serde_json::to_string_pretty(&manifest)?)?;
    let script = next.join("run.sh");
    std::fs::copy(root.join("scripts/gpu_run.sh"), &script)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::remove_dir_all(&staging)?;

    let mut total = Vec::new();
    list_files(&next, &next, &mut total)?;
    let bytes: u64 = total.iter().map(|e| e.bytes).sum();
    if mib(bytes) > args.max_mib as f64 {
        return Err(BundleError::TooLarge { got: mib(bytes), max: args.max_mib }.into());
    }
    if out.exists() {
        std::fs::remove_dir_all(&out)?;
    }
    std::fs::rename(&next, &out)?;
    eprintln!(
        "wrote {}: {:.1} MiB ({:.1} MiB unpacked); built in {:.0} s, stripped in {:.0} s, packed in {:.0} s",
        out.display(),
        mib(bytes),
        mib(manifest.payload_bytes),
        manifest.build_s,
        manifest.strip_s,
        manifest.pack_s
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(kind: &str, name: &str, test: bool) -> Built {
        Built { kind: kind.into(), name: name.into(), test, path: PathBuf::from(format!("/t/{name}-{test}")) }
    }

    #[test]
    fn selects_the_suite_binaries_examples_and_xtask() {
        let built = vec![
            built("lib", "burn_llm_kernels", true),
            built("lib", "burn_llm_kernels", false),
            built("lib", "burn_llm_models", true),
            built("test", "all", true),
            built("example", "opt_generate", false),
            built("bin", "xtask", true),
            built("bin", "xtask", false),
        ];
        let examples = ["opt_generate".to_string()];
        let names: Vec<String> = select(&built, &examples).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["kernels-tests", "burn-llm-tests", "opt_generate", "xtask"]);
        assert_eq!(select(&built, &examples).unwrap()[3].1, PathBuf::from("/t/xtask-false"));
        let err = select(&built[..3], &examples).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("`all`"), "{err}");
        let err = select(&built, &["nope".to_string()]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("`nope`"), "{err}");
    }
}
