//! Several models on one command line: `--model` and `--served-model-name` repeat and pair in
//! order; a model's default name is its directory or file stem (a hub id keeps its id); and
//! `--model-engine-args NAME='FLAGS'` gives one model its own engine flags.
//!
//! The engine flags on the command line apply to every model. A model's `FLAGS` are parsed by the
//! same clap parser ([`EngineSpec`]) together with the shared flags it does not name, so a flag
//! given for a model replaces the shared one for that model, every engine flag works per model,
//! and clap's conflicts and requirements are checked per model. Naming one of a set of
//! [`ALTERNATIVES`] (`--devices` for `--device`) replaces the shared flags of the whole set.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, Parser};

use super::{ModelEntry, ServerError};
use burn_llm::Engine;
use burn_llm::spec::{EngineSpec, Purpose};

/// Engine flags (clap ids) that say the same thing in different ways: a model's flags that name
/// one of a set replace the shared flags of the whole set.
pub const ALTERNATIVES: &[&[&str]] = &[&["device", "devices"], &["plan", "latency_bound_s", "profile_json"]];

/// The engine flags of one model alone (the parser of `--model-engine-args`).
#[derive(Debug, Parser)]
#[command(name = "--model-engine-args", no_binary_name = true)]
struct ModelFlags {
    #[command(flatten)]
    engine: EngineSpec,
    #[command(flatten)]
    serving: ServingFlags,
}

/// The server flags a model may also give for itself in `--model-engine-args`.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct ServingFlags {
    /// The model's own Jinja chat template file (replacing `--chat-template` for it).
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Requests that may wait to start for this model (replacing `--max-waiting` for it).
    #[arg(long)]
    pub max_waiting: Option<usize>,
}

/// The engine flags given on a command line, per flag as tokens that parse back to the same
/// values (the shared flags that a model's own flags are parsed with).
#[derive(Debug, Clone, Default)]
pub struct GivenFlags(Vec<(String, Vec<OsString>)>);

impl GivenFlags {
    /// The engine flags `matches` (of a command with [`EngineSpec`] flattened in) got from its
    /// command line.
    pub fn from_matches(matches: &ArgMatches) -> Self {
        let command = ModelFlags::command();
        let mut given = Vec::new();
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            let (Some(long), Some(ValueSource::CommandLine)) = (arg.get_long(), matches.value_source(id)) else {
                continue;
            };
            let Ok(Some(occurrences)) = matches.try_get_raw_occurrences(id) else { continue };
            let mut tokens = Vec::new();
            for values in occurrences {
                let values: Vec<&std::ffi::OsStr> = values.collect();
                if !arg.get_action().takes_values() {
                    tokens.push(OsString::from(format!("--{long}")));
                } else if let Some(delimiter) = arg.get_value_delimiter().filter(|_| values.len() > 1) {
                    let mut joined = OsString::from(format!("--{long}="));
                    for (i, value) in values.iter().enumerate() {
                        if i > 0 {
                            joined.push(delimiter.to_string());
                        }
                        joined.push(value);
                    }
                    tokens.push(joined);
                } else if let [value] = values.as_slice() {
                    let mut token = OsString::from(format!("--{long}="));
                    token.push(value);
                    tokens.push(token);
                } else {
                    tokens.push(OsString::from(format!("--{long}")));
                    tokens.extend(values.iter().map(OsString::from));
                }
            }
            given.push((id.to_string(), tokens));
        }
        Self(given)
    }

    /// The engine spec and server flags of a model whose own flags are `flags` (shell-like
    /// words): its flags, then the shared ones it does not give.
    pub fn model_spec(&self, flags: &str) -> Result<(EngineSpec, ServingFlags), String> {
        let own = split_words(flags)?;
        let matches = ModelFlags::command().try_get_matches_from(&own).map_err(|e| clap_message(&e))?;
        let mut named: HashSet<&str> = matches
            .ids()
            .map(|id| id.as_str())
            .filter(|id| matches.value_source(id) == Some(ValueSource::CommandLine))
            .collect();
        let replaced: Vec<&str> = ALTERNATIVES
            .iter()
            .filter(|set| set.iter().any(|id| named.contains(id)))
            .flat_map(|set| set.iter().copied())
            .collect();
        named.extend(replaced);
        let mut argv: Vec<OsString> = own.iter().map(OsString::from).collect();
        for (id, tokens) in &self.0 {
            if !named.contains(id.as_str()) {
                argv.extend(tokens.iter().cloned());
            }
        }
        ModelFlags::try_parse_from(argv).map(|f| (f.engine, f.serving)).map_err(|e| clap_message(&e))
    }
}

/// A clap error's first line, without its `error: ` prefix.
fn clap_message(error: &clap::Error) -> String {
    let text = error.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).trim().to_string()
}

/// Splits `text` into words at whitespace; single or double quotes keep spaces in a word, and a
/// backslash outside single quotes keeps the next character.
pub fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => word.get_or_insert_with(String::new).push(c),
            (_, '\\') => {
                let next = chars.next().ok_or("a trailing backslash has nothing to escape")?;
                word.get_or_insert_with(String::new).push(next);
            }
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(q) = quote {
        return Err(format!("an unclosed {q} quote"));
    }
    words.extend(word);
    Ok(words)
}

/// A model's default name: the stem of a local file (`SmolLM2.Q4_1.gguf` → `SmolLM2.Q4_1`),
/// the name of a local directory, or else the argument itself (a hub id keeps its `owner/name`).
pub fn default_name(model: &str) -> String {
    let path = Path::new(model);
    if !path.exists() {
        return model.to_string();
    }
    let named = if path.is_file() { path.file_stem() } else { path.file_name() };
    let absolute = path.canonicalize().ok();
    let name = named.or_else(|| absolute.as_deref().and_then(Path::file_name));
    name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| model.to_string())
}

/// Pairs `--model` with `--served-model-name` in order: either no name (every model takes its
/// default name) or one per model.
pub fn names(models: &[String], served: &[String]) -> Result<Vec<String>, ServerError> {
    match served.len() {
        0 => Ok(models.iter().map(|m| default_name(m)).collect()),
        n if n == models.len() => Ok(served.to_vec()),
        n => Err(ServerError::Config(format!(
            "--served-model-name is given {n} time(s) for {} --model: give one name per --model, in the same order, or none (each model is then named after its directory or file)",
            models.len()
        ))),
    }
}

/// Reads `--model-engine-args NAME=FLAGS` entries: per served name, its flags. A name not served,
/// a name given twice or an entry without `=` is an error.
pub fn overrides<'a>(entries: &'a [String], served: &[String]) -> Result<Vec<(&'a str, &'a str)>, ServerError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for entry in entries {
        let Some((name, flags)) = entry.split_once('=') else {
            return Err(ServerError::Config(format!(
                "--model-engine-args `{entry}`: write NAME='FLAGS' (NAME a served model name, FLAGS its engine flags)"
            )));
        };
        if !served.iter().any(|s| s == name) {
            return Err(ServerError::Config(format!(
                "--model-engine-args names `{name}`, which is not served: the served names are {}",
                served.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
            )));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(ServerError::Config(format!(
                "--model-engine-args is given twice for `{name}`: put all of its flags in one"
            )));
        }
        out.push((name, flags));
    }
    Ok(out)
}

/// One model of the command line, before it is loaded (the planner's model is
/// [`burn_plan::placement::ModelSpec`]; this is the server's): a placement fills in its
/// `spec.parallel.devices` (clearing `spec.device`) before [`ServedModelSpec::entry`].
#[derive(Debug, Clone)]
pub struct ServedModelSpec {
    /// Its served name.
    pub name: String,
    /// Its `--model` argument.
    pub source: String,
    /// Its engine flags: the shared ones with its `--model-engine-args`.
    pub spec: EngineSpec,
    /// Its own chat template (`--chat-template` in its `--model-engine-args`), as text.
    pub chat_template: Option<String>,
    /// Its own `--max-waiting` (from its `--model-engine-args`).
    pub max_waiting: Option<usize>,
}

impl ServedModelSpec {
    /// The model to serve: its engine is built from `spec` on the model's own thread.
    pub fn entry(self) -> ModelEntry {
        let Self { name, source, spec, chat_template, max_waiting } = self;
        let model = source.clone();
        let build: super::EngineBuilder = Box::new(move || -> Result<Box<dyn Engine>, Box<dyn std::error::Error>> {
            let dir = burn_llm_models::hub::resolve_model(&model)?;
            spec.init(&dir, Purpose::Serve, &mut std::io::stderr())
        });
        ModelEntry { chat_template, max_waiting, ..ModelEntry::new(name, source, build) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_at_spaces_and_keep_quoted_ones() {
        assert_eq!(
            split_words(" --a 1  --b 'x y' --c \"p q\" --d \\ z").unwrap(),
            ["--a", "1", "--b", "x y", "--c", "p q", "--d", " z"]
        );
        assert_eq!(split_words("''").unwrap(), [""]);
        assert!(split_words("--a 'open").is_err());
        assert!(split_words("--a \\").is_err());
    }

    #[test]
    fn default_names_are_stems_of_local_paths_and_hub_ids_otherwise() {
        let dir = std::env::temp_dir().join(format!("burn-llm-names-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tiny-llama")).unwrap();
        std::fs::write(dir.join("m.Q4_1.gguf"), b"").unwrap();
        let local = |p: &str| dir.join(p).to_string_lossy().into_owned();
        assert_eq!(default_name(&local("tiny-llama")), "tiny-llama");
        assert_eq!(default_name(&format!("{}/", local("tiny-llama"))), "tiny-llama");
        assert_eq!(default_name(&local("m.Q4_1.gguf")), "m.Q4_1");
        assert_eq!(default_name("HuggingFaceTB/SmolLM2-135M"), "HuggingFaceTB/SmolLM2-135M");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn names_pair_in_order_or_default() {
        let models = ["a/x".to_string(), "b/y".to_string()];
        assert_eq!(names(&models, &[]).unwrap(), ["a/x", "b/y"]);
        assert_eq!(names(&models, &["p".into(), "q".into()]).unwrap(), ["p", "q"]);
        let err = names(&models, &["p".into()]).unwrap_err().to_string();
        assert!(err.contains("1 time(s) for 2 --model"), "{err}");
    }

    #[test]
    fn a_models_flags_replace_the_shared_ones_it_names() {
        let shared =
            ["x", "--kv-cache-memory", "blocks:96", "--dtype", "f32", "--devices", "flex,flex", "--exact-matmul"];
        let matches = ModelFlags::command().no_binary_name(false).try_get_matches_from(shared).unwrap();
        let given = GivenFlags::from_matches(&matches);
        let (spec, serving) = given.model_spec("--kv-cache-memory 'blocks:8' --devices flex --max-waiting 3").unwrap();
        assert_eq!(serving, ServingFlags { chat_template: None, max_waiting: Some(3) });
        let alone = |flags: &[&str]| ModelFlags::try_parse_from(flags).unwrap().engine;
        let kv = alone(&["--kv-cache-memory", "blocks:8"]).paged.kv_cache_memory;
        assert_eq!(format!("{:?}", spec.paged.kv_cache_memory), format!("{kv:?}"));
        assert_eq!(spec.parallel.devices, Some(vec!["flex".to_string()]));
        assert!(spec.exact_matmul, "shared flags the model does not name stay");
        assert_eq!(format!("{:?}", spec.dtype), format!("{:?}", alone(&["--dtype", "f32"]).dtype));
        let (same, _) = given.model_spec("").unwrap();
        assert_eq!(same.parallel.devices, Some(vec!["flex".to_string(), "flex".to_string()]));
        let local = ModelFlags::command().no_binary_name(false).try_get_matches_from(["x", "--device", "flex"]);
        let (remote, _) = GivenFlags::from_matches(&local.unwrap()).model_spec("--devices flex,flex").unwrap();
        assert!(remote.device.is_none(), "--devices replaces the shared --device");
        let err = given.model_spec("--port 1").unwrap_err();
        assert!(err.contains("--port"), "{err}");
        let err = given.model_spec("--plan p.json --latency-bound-s 2").unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
    }

    #[test]
    fn overrides_must_name_served_models_once() {
        let served = ["a".to_string(), "b".to_string()];
        let entries = ["a=--dtype f32".to_string()];
        assert_eq!(overrides(&entries, &served).unwrap(), [("a", "--dtype f32")]);
        for bad in [vec!["c=--dtype f32"], vec!["a"], vec!["a=", "a=--dtype f32"]] {
            let bad: Vec<String> = bad.into_iter().map(String::from).collect();
            assert!(overrides(&bad, &served).is_err(), "{bad:?}");
        }
    }
}
