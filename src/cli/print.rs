//! How a text run prints its outputs ([`TextPrinter`]) and the progress it shows meanwhile.

use std::io::Write;

use burn_llm_models::{GenerationOutput, Prompt, SamplingParams, StreamEvent};

use crate::engine::Capabilities;

/// How a text run prints, decided by the request and the engine's [`Capabilities`] alone:
/// - one prompt, one sequence, an engine that streams: the prompt, then the text as it comes;
/// - an engine that ranks several sequences per prompt (`--n`, `--best-of`, beam search):
///   `[i.rank] prompt text` for every returned sequence at the end, best first, since ranks are
///   known only then (the same labels whatever `--n` is, so the format does not change with it);
/// - otherwise `[i] prompt text` for each request as soon as it finishes, so outputs never
///   interleave.
///
/// Where nothing shows until a request ends (every mode but the live one), a progress line on
/// standard error counts the tokens and finished sequences (drawn only on a terminal).
pub struct TextPrinter<'a> {
    prompts: &'a [Prompt],
    mode: PrintMode,
    started: bool,
    pending: Vec<String>,
    progress: Option<Progress>,
}

/// The progress line: tokens so far and sequences finished.
struct Progress {
    bar: indicatif::ProgressBar,
    finished: usize,
}

impl Progress {
    fn new() -> Self {
        let bar = indicatif::ProgressBar::new_spinner();
        let style = indicatif::ProgressStyle::with_template("{spinner} {pos} tokens · {per_sec} · {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner());
        bar.set_style(style);
        Self { bar, finished: 0 }
    }

    fn on_token(&mut self, finished: bool) {
        self.bar.inc(1);
        if finished {
            self.finished += 1;
            self.bar.set_message(format!("{} sequences finished", self.finished));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrintMode {
    Live,
    PerRequest,
    Ranked,
}

impl<'a> TextPrinter<'a> {
    /// A printer for a run of `prompts` with `params` on an engine that can do `capabilities`.
    pub fn new(prompts: &'a [Prompt], params: &SamplingParams, capabilities: Capabilities) -> Self {
        let mode = if params.is_single_sequence() && prompts.len() == 1 && capabilities.streams_tokens {
            PrintMode::Live
        } else if capabilities.multiple_sequences {
            PrintMode::Ranked
        } else {
            PrintMode::PerRequest
        };
        let progress = (mode != PrintMode::Live).then(Progress::new);
        Self { prompts, mode, started: false, pending: vec![String::new(); prompts.len()], progress }
    }

    /// Prints what a token makes visible.
    pub fn on_token(&mut self, event: StreamEvent<'_>, out: &mut dyn Write) -> std::io::Result<()> {
        if let Some(progress) = &mut self.progress {
            progress.on_token(event.finished);
        }
        match self.mode {
            PrintMode::Live => {
                if !self.started {
                    self.started = true;
                    if let Some(Prompt::Text(text)) = self.prompts.first() {
                        out.write_all(text.as_bytes())?;
                    }
                }
                out.write_all(event.text.as_bytes())?;
            }
            PrintMode::PerRequest => {
                let Some(pending) = self.pending.get_mut(event.request) else { return Ok(()) };
                pending.push_str(event.text);
                if !event.finished {
                    return Ok(());
                }
                let text = std::mem::take(pending);
                let line = format!("[{}] {}{text}", event.request, self.label(event.request));
                match &self.progress {
                    Some(progress) => progress.bar.suspend(|| writeln!(out, "{line}"))?,
                    None => writeln!(out, "{line}")?,
                }
            }
            PrintMode::Ranked => return Ok(()),
        }
        out.flush()
    }

    /// Prints what is only known at the end (ranked sequences).
    pub fn finish(&mut self, output: &GenerationOutput, out: &mut dyn Write) -> std::io::Result<()> {
        if let Some(progress) = self.progress.take() {
            progress.bar.finish_and_clear();
        }
        if self.mode != PrintMode::Ranked {
            return Ok(());
        }
        let per_prompt = (output.requests.len() / self.prompts.len().max(1)).max(1);
        for (k, request) in output.requests.iter().enumerate() {
            let (i, rank) = (k / per_prompt, k % per_prompt);
            writeln!(out, "[{i}.{rank}] {}{}", self.label(i), request.text)?;
        }
        out.flush()
    }

    /// How prompt `i` is shown before its text: the text, the ids, or a conversation's last
    /// message on its own line.
    fn label(&self, i: usize) -> String {
        match self.prompts.get(i) {
            Some(Prompt::Text(text)) => text.clone(),
            Some(Prompt::Ids(ids)) => format!("{ids:?}"),
            Some(Prompt::Chat(messages)) => format!("{}\n", messages.last().map_or("", |m| m.content.as_str())),
            None => String::new(),
        }
    }
}
