//! The benchmark's report: `pipeline.{json,md}` with every part's figures and each target of the
//! issue checked, and the two charts (time to first token against prompt length, the
//! inter-token latency distribution).

use std::path::Path;

use serde::Serialize;

use super::chunked::ChunkedResult;
use super::file_name;
use super::stages::StagesResult;
use super::ttft::TtftResult;
use crate::bench::plot::{self, Axes, Panel};
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// What the parts measured (a part not run is absent).
#[derive(Debug, Default, Serialize)]
pub struct Results {
    pub stages: Option<StagesResult>,
    pub ttft: Option<TtftResult>,
    pub chunked: Option<ChunkedResult>,
}

/// One target of the issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub target: String,
    pub value: String,
    pub met: bool,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: Header,
    targets: Vec<Target>,
    #[serde(flatten)]
    results: Results,
}

/// The issue's targets, checked against `results`.
pub fn targets(results: &Results) -> Vec<Target> {
    let mut out = Vec::new();
    let mut push = |target: String, value: String, met: bool| out.push(Target { target, value, met });
    let pct = |e: f64| format!("{:+.0}%", 100.0 * e);
    if let Some(s) = &results.stages {
        for r in &s.rows {
            for (what, v) in [
                ("decode bottleneck", r.decode_bottleneck),
                ("decode step", r.decode_step),
                ("micro-batched step", r.batch_step),
                ("prompt", r.prompt),
            ] {
                push(format!("(a) {}: {what} within 20% of predicted", r.split), pct(v.error), v.error.abs() <= 0.2);
            }
        }
        if let [even, auto] = &s.rows[..] {
            for (what, a, e) in [
                ("decode step", auto.decode_step.measured_ms, even.decode_step.measured_ms),
                ("micro-batched step", auto.batch_step.measured_ms, even.batch_step.measured_ms),
                ("prompt", auto.prompt.measured_ms, even.prompt.measured_ms),
            ] {
                push(format!("(a) auto at least as fast as even: {what}"), format!("{:.2}× even", a / e), a <= e);
            }
        }
    }
    if let Some(t) = &results.ttft {
        let longest = t.points.iter().map(|p| p.prompt_len).max().unwrap_or(0);
        let ratio = t.planner_over_unsliced_longest;
        push(format!("(b) planner slices ≤ 0.7 × unsliced at {longest} tokens"), format!("{ratio:.2}×"), ratio <= 0.7);
        for p in t.points.iter().filter(|p| p.prompt_len == longest) {
            push(
                format!("(b) {} within 20% of predicted at {longest} tokens", p.slicing),
                pct(p.ttft.error),
                p.ttft.error.abs() <= 0.2,
            );
        }
    }
    if let Some(c) = &results.chunked {
        push(
            "(c) chunked p99 inter-token latency ≤ 0.5 × unchunked".into(),
            format!("{:.2}×", c.p99_ratio),
            c.p99_ratio <= 0.5,
        );
        push(
            "(c) chunked throughput within 10% of unchunked".into(),
            format!("{:.2}×", c.throughput_ratio),
            (c.throughput_ratio - 1.0).abs() <= 0.1 || c.throughput_ratio > 1.0,
        );
    }
    out
}

/// Writes `pipeline.{json,md}` and the charts to `out`.
pub fn write(out: &Path, command: &str, model: &str, results: Results) -> Result<(), Box<dyn std::error::Error>> {
    let header = Header::new("pipeline", command.to_string(), Some("flex"), model);
    let targets = targets(&results);
    let mut md = header.markdown("Automatic stages, token slices and chunked prefill (Alpa, TeraPipe, vLLM)");
    md.push_str(&format!(
        "- model: {model} on the default quantized CPU path (8-bit input rows); greedy, EOS ignored\n\
         - devices: this process's flex backend, and two `worker` processes on loopback, each `--threads 1`\n\
         - predictions: each device's profile (the per-device profiler `--stage-layers auto` uses: the checkpoint's first layers timed back to back, a pass's fixed cost separated, embeddings and head as stored) and each link's measured latency and rate\n\n"
    ));
    md.push_str("## Targets\n\n");
    md.push_str(&table(
        &[("target", Left), ("this run", Right), ("met", Left)],
        targets.iter().map(|t| vec![t.target.clone(), t.value.clone(), if t.met { "yes" } else { "**no**" }.into()]),
    ));
    if let Some(s) = &results.stages {
        md.push_str(&stages_md(s));
    }
    if let Some(t) = &results.ttft {
        md.push_str(&ttft_md(t, out));
    }
    if let Some(c) = &results.chunked {
        md.push_str(&chunked_md(c, out));
    }
    let report = Report { header, targets, results };
    report::write(out, "pipeline", &report, &md)?;
    println!("{md}");
    Ok(())
}

fn stages_md(s: &StagesResult) -> String {
    let w = &s.workload;
    let mut md = format!(
        "\n## (a) Automatic stages vs even split\n\n- devices: {} — {}\n- decode step: one sequence after a {}-token prompt (stages in turn), and {} sequences in {} micro-batches of one (stages overlapping), medians of {} steps; measured bottleneck = (micro-batched step − one-sequence step) ÷ {}\n- prompt: one {}-token prompt, unsliced, median of {}\n- predicted: each stage's time from its device's profile and link; a pass of M micro-batches `Σ_s t_s + (M − 1)·(max_s t_s + κ·(Σ_s t_s − max_s t_s))`, with the devices' interference κ measured on the split (each device running its stage's layers); the auto split's decode steps against the planner's own prediction (the stage times and κ it chose the split with, measured at the engine's start-up)\n- on equal shares, what `--stage-layers auto` plans with first: {}\n\n",
        s.devices.join(", "),
        s.unequal,
        w.prompt,
        w.batch,
        w.batch,
        w.steps,
        w.batch.max(2) - 1,
        w.long_prompt,
        w.repeats,
        s.interference.summary(&s.devices),
    );
    let ms = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(" / ");
    let versus = |v: &super::predict::Versus| format!("{:.1} / {:.1}", v.predicted_ms, v.measured_ms);
    md.push_str(&table(
        &[
            ("split", Left),
            ("stage layers", Left),
            ("decode stage ms (pred.)", Right),
            ("κ on the split", Right),
            ("κ of the decode prediction", Right),
            ("bottleneck ms: pred. / meas.", Right),
            ("1-seq step ms: pred. / meas.", Right),
            ("micro-batched step ms: pred. / meas.", Right),
            ("prompt stage ms (pred.)", Right),
            ("prompt ms: pred. / meas.", Right),
        ],
        s.rows.iter().map(|r| {
            vec![
                r.split.clone(),
                r.stage_layers.join(", "),
                ms(&r.decode_stage_ms),
                format!("{:.2}", r.interference.kappa),
                format!("{:.2}", r.decode_kappa),
                versus(&r.decode_bottleneck),
                versus(&r.decode_step),
                versus(&r.batch_step),
                ms(&r.prompt_stage_ms),
                format!("{:.0} / {:.0}", r.prompt.predicted_ms, r.prompt.measured_ms),
            ]
        }),
    ));
    for r in &s.rows {
        md.push_str(&format!(
            "\n{}, on its split: {}; decode predicted from {}\n",
            r.split,
            r.interference.summary(&s.devices),
            r.decode_predicted_by
        ));
    }
    for r in s.rows.iter().filter(|r| !r.plan_log.is_empty()) {
        md.push_str(&format!("\n{} — the engine's start-up log:\n\n```\n{}\n```\n", r.split, r.plan_log));
    }
    md
}

fn ttft_md(t: &TtftResult, out: &Path) -> String {
    let mut md = format!(
        "\n## (b) Time to first token at PP=2 (token slices)\n\n- stages: layers {} on {}; one prompt on an idle engine, median of the measured runs\n- predicted: TeraPipe's `Σ t_i + (K − 1)·max t_i` for the slices used (`t_i` the slowest stage's time for slice `i`), plus `κ·(K − 1)·(Σ t_i − max t_i)` at the workers' interference on a prefill step, κ = {:.2} (the overlapped work slowed as a micro-batch's is); unsliced = K whole-prompt passes\n\n",
        t.stage_layers.join(", "),
        t.devices.join(", "),
        t.interference
    );
    md.push_str(&table(
        &[
            ("slicing", Left),
            ("prompt tokens", Right),
            ("slices", Left),
            ("predicted ms", Right),
            ("measured ms", Right),
            ("error", Right),
        ],
        t.points.iter().map(|p| {
            let slices = if p.slices.len() > 8 {
                format!(
                    "{} slices ({}…)",
                    p.slices.len(),
                    p.slices[..4].iter().map(usize::to_string).collect::<Vec<_>>().join(",")
                )
            } else {
                p.slices.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
            };
            vec![
                p.slicing.clone(),
                p.prompt_len.to_string(),
                slices,
                format!("{:.0}", p.ttft.predicted_ms),
                format!("{:.0}", p.ttft.measured_ms),
                format!("{:+.0}%", 100.0 * p.ttft.error),
            ]
        }),
    ));
    let mut labels: Vec<String> = t.points.iter().map(|p| p.slicing.clone()).collect();
    labels.dedup();
    let series = |predicted: bool| {
        labels
            .iter()
            .map(|l| {
                let points = t.points.iter().filter(|p| &p.slicing == l);
                let y = |p: &super::ttft::TtftPoint| if predicted { p.ttft.predicted_ms } else { p.ttft.measured_ms };
                (l.clone(), points.map(|p| (p.prompt_len as f64, Some(y(p) / 1e3))).collect())
            })
            .collect()
    };
    let panels = [
        Panel { title: "measured".into(), series: series(false) },
        Panel { title: "predicted".into(), series: series(true) },
    ];
    let axes = Axes { x: "prompt tokens", y: "time to first token (s)", log_x: false };
    md.push_str(&chart(
        plot::line_png(&out.join("pipeline-ttft.png"), &panels, &axes),
        "time to first token against prompt length",
    ));
    md
}

fn chunked_md(c: &ChunkedResult, out: &Path) -> String {
    let w = &c.workload;
    let mut md = format!(
        "\n## (c) Chunked prefill on one device under mixed load\n\n- device: flex (this process, every core)\n- {} sequences ({}-token prompts) decode {} tokens each; {} prompts of {}–{} tokens arrive from step {}, one every {} steps, each generating {} tokens\n- chunked: `--max-num-batched-tokens {}` (decodes first, then prompt chunks up to the budget); unchunked: `--no-chunked-prefill` with a budget that holds the longest prompt next to the decodes\n- inter-token latency: every gap between consecutive tokens of a sequence; throughput: prompt + output tokens over the run's wall time\n\n",
        w.decoders,
        w.decoder_prompt,
        w.decoder_output,
        w.long_prompts,
        w.long_min,
        w.long_max,
        w.first_arrival_step,
        w.gap,
        w.long_output,
        w.chunk_tokens
    );
    md.push_str(&table(
        &[
            ("configuration", Left),
            ("budget", Right),
            ("steps", Right),
            ("ITL p50 ms", Right),
            ("ITL p99 ms", Right),
            ("ITL max ms", Right),
            ("output tokens/s", Right),
            ("total tokens/s", Right),
            ("long prompts' TTFT p50 s", Right),
        ],
        c.rows.iter().map(|r| {
            vec![
                r.config.clone(),
                r.max_num_batched_tokens.to_string(),
                r.steps.to_string(),
                format!("{:.1}", r.itl_p50_ms),
                format!("{:.1}", r.itl_p99_ms),
                format!("{:.1}", r.itl_max_ms),
                format!("{:.1}", r.output_tokens_per_s),
                format!("{:.1}", r.total_tokens_per_s),
                format!("{:.2}", r.long_ttft_p50_s),
            ]
        }),
    ));
    md.push_str(&format!(
        "\np99 inter-token latency chunked ÷ unchunked: {:.2}×; throughput chunked ÷ unchunked: {:.2}×\n",
        c.p99_ratio, c.throughput_ratio
    ));
    let series = c.rows.iter().map(|r| (r.config.clone(), cdf(&r.itl_ms))).collect();
    let panels = [Panel { title: "inter-token latency (CDF)".into(), series }];
    let axes = Axes { x: "inter-token latency (ms)", y: "fraction of gaps ≤ x", log_x: true };
    md.push_str(&chart(
        plot::line_png(&out.join("pipeline-itl.png"), &panels, &axes),
        "inter-token latency distribution",
    ));
    md
}

/// The empirical CDF of sorted `values` at every 2nd percentile and at p99 (points the chart can
/// draw one by one).
fn cdf(sorted: &[f64]) -> Vec<(f64, Option<f64>)> {
    let mut ps: Vec<f64> = (1..=50).map(|k| 2.0 * k as f64).collect();
    ps.push(99.0);
    ps.sort_by(f64::total_cmp);
    ps.into_iter().map(|p| (report::percentile(sorted, p).max(1e-3), Some(p / 100.0))).collect()
}

fn chart(result: Result<std::path::PathBuf, Box<dyn std::error::Error>>, alt: &str) -> String {
    match result {
        Ok(path) => format!("\n![{alt}]({})\n", file_name(&path)),
        Err(e) => format!("\n(no chart: {e})\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::pipeline::chunked::{ChunkedRow, MixedLoad};

    fn row(config: &str, p99: f64, total: f64) -> ChunkedRow {
        ChunkedRow {
            config: config.into(),
            max_num_batched_tokens: 512,
            chunked_prefill: config == "chunked",
            seconds: 1.0,
            steps: 3,
            output_tokens: 3,
            output_tokens_per_s: 3.0,
            total_tokens_per_s: total,
            itl_p50_ms: 10.0,
            itl_p99_ms: p99,
            itl_max_ms: p99,
            long_ttft_p50_s: 0.5,
            long_ttft_max_s: 0.5,
            itl_ms: vec![10.0, 10.0, p99],
        }
    }

    fn chunked(p99: [f64; 2], total: [f64; 2]) -> ChunkedResult {
        let workload = MixedLoad {
            decoders: 2,
            decoder_prompt: 4,
            decoder_output: 8,
            long_prompts: 1,
            long_min: 8,
            long_max: 16,
            long_output: 2,
            first_arrival_step: 1,
            gap: 2,
            chunk_tokens: 8,
        };
        let rows = vec![row("unchunked", p99[0], total[0]), row("chunked", p99[1], total[1])];
        ChunkedResult { workload, rows, p99_ratio: p99[1] / p99[0], throughput_ratio: total[1] / total[0] }
    }

    #[test]
    fn targets_follow_the_measured_ratios() {
        let met = |r: &Results| targets(r).iter().map(|t| t.met).collect::<Vec<_>>();
        let good = Results { chunked: Some(chunked([100.0, 40.0], [100.0, 95.0])), ..Results::default() };
        assert_eq!(met(&good), [true, true]);
        let slow = Results { chunked: Some(chunked([100.0, 60.0], [100.0, 80.0])), ..Results::default() };
        assert_eq!(met(&slow), [false, false]);
    }

    #[test]
    fn report_writes_json_markdown_and_the_chart() {
        let dir = std::env::temp_dir().join(format!("pipeline-report-{}", std::process::id()));
        let results = Results { chunked: Some(chunked([100.0, 40.0], [100.0, 95.0])), ..Results::default() };
        write(&dir, "cargo xtask bench pipeline --parts chunked", "m.gguf", results).expect("report written");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("pipeline.json")).unwrap_or_default())
                .unwrap_or_default();
        assert_eq!(json["benchmark"], "pipeline");
        assert_eq!(json["chunked"]["rows"][1]["config"], "chunked");
        assert!(json["stages"].is_null() && json["targets"][0]["met"] == true);
        let md = std::fs::read_to_string(dir.join("pipeline.md")).unwrap_or_default();
        assert!(md.contains("## (c) Chunked prefill") && !md.contains("## (a)"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cdf_rises_to_one_through_the_sample() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        let points = cdf(&sorted);
        assert_eq!(points.first(), Some(&(2.0, Some(0.02))));
        assert_eq!(points.last(), Some(&(100.0, Some(1.0))));
        assert!(points.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}
