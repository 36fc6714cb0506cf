//! The report of `bench schedule`: its Markdown tables and the plot's series.

use burn_llm::plan::profile::Profile;
use burn_llm::plan::schedule::ScheduleOutput;

use super::super::plot;
use super::super::process_cpu::CpuShares;
use super::devices::Devices;
use super::measure::{Run, Verdict};
use super::{Args, BoundResult, Planned, WorkloadResult};
use crate::report::{self, Align::Left, Align::Right, Header, table};

/// A measured step table: one row per batch, one column per point of the other axis.
fn step_table(batch_title: &str, other_title: &str, batch: &[f64], other: &[f64], ms: &[Vec<f64>]) -> String {
    let titles: Vec<String> =
        std::iter::once(batch_title.to_string()).chain(other.iter().map(|o| format!("{other_title} {o}"))).collect();
    let columns: Vec<(&str, report::Align)> = titles.iter().map(|t| (t.as_str(), Right)).collect();
    table(
        &columns,
        batch.iter().zip(ms).map(|(b, row)| {
            std::iter::once(b.to_string()).chain(row.iter().map(|v| format!("{v:.1}"))).collect::<Vec<_>>()
        }),
    )
}

fn fmt_load(load: Option<f64>) -> String {
    load.map_or("unknown".into(), |l| format!("{l:.2}"))
}

/// Throughput against bound per workload, for the plot: (a), (b), (c) and (d), `None` where the
/// system has no configuration meeting the bound.
pub(super) fn plot_series(results: &[WorkloadResult]) -> Vec<plot::Panel> {
    results
        .iter()
        .map(|w| {
            let series = |pick: &dyn Fn(&BoundResult) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
                w.bounds.iter().map(|b| (b.latency_bound_s, pick(b))).collect()
            };
            let met = |v: &Verdict| v.meets_bound.then_some(v.run.requests_per_s);
            plot::Panel {
                title: w.workload.name.to_string(),
                series: vec![
                    ("(a) FCFS default".into(), series(&|b| met(&b.fcfs_default))),
                    ("(b) FCFS tuned".into(), series(&|b| b.fcfs_tuned.as_ref().map(|v| v.run.requests_per_s))),
                    ("(c) ExeGPT plan".into(), series(&|b| b.exegpt.as_ref().ok().and_then(|p| met(&p.verdict)))),
                    ("(d) static tuned".into(), series(&|b| b.static_tuned.as_ref().map(|v| v.run.requests_per_s))),
                ],
            }
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn markdown(
    header: &Header,
    model: &str,
    args: &Args,
    devices: &Devices,
    profile_source: &str,
    profile: &Profile,
    load: [Option<f64>; 2],
    pct: f64,
    results: &[WorkloadResult],
) -> String {
    let mut md = header.markdown("ExeGPT schedule vs FCFS under latency bounds");
    md.push_str(&format!(
        "- model: {model}\n- devices: {}; {}\n- KV pool: {} tokens in blocks of {}; FCFS grid of `max_num_seqs` 1, 2, 4, … up to {} and each plan's `B_D`\n\
         - profile: {profile_source}\n\
         - latency: p{pct} over requests of (finish − start of the request's prefill step): ExeGPT's SLA-(b), the time \
         to generate the p{pct}-length output, as the planner predicts it; closed run, all requests queued at t = 0. \
         \"met\" compares it with the bound. (a) counts as meeting a bound only if its one run does.\n\
         - throughput (req/s): steady state, as the planner predicts it: requests admitted between the first completion \
         and the last prefill step, over that window (the whole run's rate where a run has no such window, marked *); \
         tok/s and \"run req/s\" are over the whole run\n\
         - {}\n\
         - 1-minute load average before the first run / after the last: {} / {} (the machine's cores are shared: \
         a load above its {} threads means other work slowed these runs)\n",
        devices.describe(),
        if devices.count() == 2 {
            format!(
                "(a), (b) and (d) run the model as a PP=2 pipeline over both (iteration-level scheduling), as vLLM runs \
                 pipeline parallelism: two virtual engines over the one pipeline, each with half the seats and of the \
                 KV pool, one micro-batch a step (one engine at one seat); (c) runs the planner's choice for two \
                 devices{}: WAA (prefill on the first device, decode on the second, each request's KV blocks moved \
                 after its prefill) or RRA on one virtual engine per decoder micro-batch over the same pipeline; each \
                 device a full replica with the KV pool below",
                match &args.strategies {
                    Some(s) => format!(
                        " among {} (`--strategies`)",
                        s.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                    ),
                    None => String::new(),
                }
            )
        } else {
            "every system on it".to_string()
        },
        args.kv_tokens,
        args.block_size,
        args.max_batch,
        match args.output_len {
            Some(n) => format!(
                "every request generates exactly {n} tokens (`--output-len`); prompts follow the workload's distribution"
            ),
            None => "prompt and output lengths follow the workload's distributions; every request generates exactly its \
                     drawn output length (EOS ignored), as in ExeGPT §7.1; the bound is on the p99 output's latency"
                .into(),
        },
        fmt_load(load[0]),
        fmt_load(load[1]),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    if let Some(steps) = &profile.engine_step_ms {
        md.push_str("\nMeasured paged-engine steps (the profile's `engine_step_ms`, what the planner reads), ms:\n\n");
        let (d, p) = (&steps.decode, &steps.prefill);
        md.push_str(&step_table("decode batch", "context", &d.batch, &d.context, &d.ms));
        md.push('\n');
        md.push_str(&step_table("prefill batch", "prompt tokens", &p.batch, &p.tokens, &p.ms));
    }
    if let Some(v) = &profile.step_variation {
        md.push_str(&format!(
            "\nStep variation (the profile's `step_variation`: the 99th percentile, over every timed run, of the run's \
             prefill and of the mean of its consecutive decode steps, over its point's median): prefill +{:.1}%, decode \
             +{:.1}%.",
            100.0 * v.prefill,
            100.0 * v.decode
        ));
        match &v.runs {
            Some(r) => md.push_str(&format!(
                " Over the same runs (decode runs of {} steps), mean +{:.1}% and standard deviation {:.1}% for prefills, \
                 mean +{:.1}% and standard deviation {:.1}% for decode runs. The planner's latency takes its sum of \
                 steps at its percentile from these (mean plus z standard deviations of the sum, at most every step at \
                 the 99th percentile; ExeGPT §7.9); its throughput takes the medians.\n",
                r.decode_steps,
                100.0 * r.prefill.mean,
                100.0 * r.prefill.std,
                100.0 * r.decode.mean,
                100.0 * r.decode.std
            )),
            None => md.push_str(
                " The planner's latency counts every step at it (ExeGPT §7.9); its throughput takes the medians.\n",
            ),
        }
    }
    let yes = |b: bool| if b { "yes" } else { "**no**" }.to_string();
    for w in results {
        md.push_str(&format!(
            "\n## {}: {} requests, mean prompt {:.1} tokens, {}\n\nBounds {}.\n\n",
            w.workload.name,
            w.requests,
            w.mean_prompt,
            match w.output_len {
                Some(n) => format!("{n} output tokens each"),
                None => format!("output mean {:.1} tokens, p99 {}", w.mean_output, w.p99_output),
            },
            if w.bounds_from_profile { "chosen from the profile" } else { "given by --latency-bounds" }
        ));
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("(a) req/s / tok/s", Right),
                (&format!("(a) p{pct} s"), Right),
                ("(a) met", Left),
                ("(b) max_num_seqs", Right),
                ("(b) req/s / tok/s", Right),
                (&format!("(b) p{pct} s"), Right),
                ("(c) B_E, N_D, B_D", Right),
                ("(c) req/s / tok/s", Right),
                (&format!("(c) p{pct} s"), Right),
                ("(c) met", Left),
                ("(c)/(b)", Right),
            ],
            w.bounds.iter().map(|b| {
                let (seqs, b_rate, b_lat) = tuned_cells(&b.fcfs_tuned);
                let (shape, c_rate, c_lat, c_met) = match &b.exegpt {
                    Ok(p) => (
                        plan_shape(&p.plan),
                        rate(&p.verdict.run),
                        format!("{:.3}", p.verdict.run.latency_s),
                        yes(p.verdict.meets_bound),
                    ),
                    Err(_) => ("no plan".into(), "–".into(), "–".into(), "–".into()),
                };
                vec![
                    format!("{:.3}", b.latency_bound_s),
                    rate(&b.fcfs_default.run),
                    format!("{:.3}", b.fcfs_default.run.latency_s),
                    yes(b.fcfs_default.meets_bound),
                    seqs,
                    b_rate,
                    b_lat,
                    shape,
                    c_rate,
                    c_lat,
                    c_met,
                    b.exegpt_over_tuned.map_or("–".into(), |r| format!("{r:.2}×")),
                ]
            }),
        ));
        md.push_str("\nThe plan's predictions against the run");
        if let Some(speed) = w.host_speed {
            md.push_str(&format!(
                " (host speed {speed:.2}: FCFS at one seat ran at {speed:.2}× the speed the profile's steps predict \
                 for it, so every prediction below is off by about that factor before any modelling error)"
            ));
        }
        md.push_str(":\n\n");
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("predicted req/s", Right),
                ("measured req/s", Right),
                ("measured/predicted", Right),
                (&format!("predicted p{pct} s"), Right),
                (&format!("measured p{pct} s"), Right),
                ("measured/predicted", Right),
            ],
            w.bounds.iter().filter_map(|b| b.exegpt.as_ref().ok().map(|p| (b.latency_bound_s, p))).map(|(bound, p)| {
                vec![
                    format!("{bound:.3}"),
                    format!("{:.2}", p.plan.throughput_qps),
                    format!("{:.2}{}", p.verdict.run.requests_per_s, star(&p.verdict.run)),
                    format!("{:.2}", p.throughput_measured_over_predicted),
                    format!("{:.3}", p.plan.latency_s),
                    format!("{:.3}", p.verdict.run.latency_s),
                    format!("{:.2}", p.latency_measured_over_predicted),
                ]
            }),
        ));
        md.push_str(&device_time(w));
        md.push_str(&cores_table(w));
        md.push_str(
            "\nAgainst (d), static batching tuned the same way (FasterTransformer-style, ExeGPT's baseline in §7.3: \
             a batch starts when the previous one has finished; the KV pool holds every seat's reservation):\n\n",
        );
        md.push_str(&table(
            &[
                ("bound s", Right),
                ("(d) max_num_seqs", Right),
                ("(d) req/s / tok/s", Right),
                (&format!("(d) p{pct} s"), Right),
                ("(c) req/s", Right),
                ("(c)/(d)", Right),
            ],
            w.bounds.iter().map(|b| {
                let (seqs, d_rate, d_lat) = tuned_cells(&b.static_tuned);
                let c_rate = match &b.exegpt {
                    Ok(p) if p.verdict.meets_bound => format!("{:.2}", p.verdict.run.requests_per_s),
                    Ok(p) => format!("{:.2} (missed)", p.verdict.run.requests_per_s),
                    Err(_) => "no plan".into(),
                };
                vec![
                    format!("{:.3}", b.latency_bound_s),
                    seqs,
                    d_rate,
                    d_lat,
                    c_rate,
                    b.exegpt_over_static.map_or("–".into(), |r| format!("{r:.2}×")),
                ]
            }),
        ));
        md.push_str("\nFCFS grid (b) picks from:\n\n");
        md.push_str(&grid_table(&w.fcfs_grid, pct));
        md.push_str(
            "\nStatic grid (d) picks from (at one seat, FCFS's one-seat run: one request at a time either way):\n\n",
        );
        md.push_str(&grid_table(&w.static_grid, pct));
    }
    md
}

/// `*` after a rate that is the whole run's, not the steady state's.
fn star(r: &Run) -> &'static str {
    if r.steady { "" } else { "*" }
}

/// `req/s / tok/s` of a run.
fn rate(r: &Run) -> String {
    format!("{:.2}{} / {:.1}", r.requests_per_s, star(r), r.tokens_per_s)
}

/// A tuned baseline's cells: its `max_num_seqs`, rate and latency, or "none meets".
fn tuned_cells(tuned: &Option<Verdict>) -> (String, String, String) {
    match tuned {
        Some(v) => (v.run.max_num_seqs.to_string(), rate(&v.run), format!("{:.3}", v.run.latency_s)),
        None => ("none meets".into(), "–".into(), "–".into()),
    }
}

/// (c)'s requests/s over a tuned baseline's, where both exist.
pub(super) fn throughput_ratio(exegpt: &Result<Planned, String>, tuned: &Option<Verdict>) -> Option<f64> {
    match (exegpt, tuned) {
        (Ok(c), Some(t)) => Some(c.verdict.run.requests_per_s / t.run.requests_per_s),
        _ => None,
    }
}

/// One grid's runs: throughput and latency by `max_num_seqs`.
fn grid_table(runs: &[Run], pct: f64) -> String {
    table(
        &[
            ("max_num_seqs", Right),
            ("req/s", Right),
            ("run req/s", Right),
            ("tokens/s", Right),
            (&format!("p{pct} latency s"), Right),
            ("mean latency s", Right),
            (&format!("p{pct} from arrival s"), Right),
            ("cores busy", Right),
        ],
        runs.iter().map(|r| {
            vec![
                r.max_num_seqs.to_string(),
                format!("{:.2}{}", r.requests_per_s, star(r)),
                format!("{:.2}", r.run_requests_per_s),
                format!("{:.1}", r.tokens_per_s),
                format!("{:.3}", r.latency_s),
                format!("{:.3}", r.mean_latency_s),
                format!("{:.3}", r.latency_from_arrival_s),
                cores_cell(r),
            ]
        }),
    )
}

/// The cores each metered process kept busy over a run, and their sum (`–` unmetered).
fn cores_cell(r: &Run) -> String {
    r.cpu.as_ref().map_or("–".into(), CpuShares::sum_cell)
}

/// Where the cores went in (b)'s and (c)'s runs at each bound: whether a system left a device
/// idle or the host's cores were full; empty when no run was metered.
fn cores_table(w: &WorkloadResult) -> String {
    let Some(first) = w.fcfs_grid.iter().find_map(|r| r.cpu.as_ref()) else { return String::new() };
    let mut md = format!(
        "\nWhere the cores went: CPU seconds over the run's seconds of {}, and their sum, against the host's {} \
         cores (the bench process is the client driving the devices, with every engine's thread):\n\n",
        first.names(),
        first.host_cores
    );
    md.push_str(&table(
        &[("bound s", Right), ("(b) FCFS tuned", Right), ("(c) ExeGPT", Right)],
        w.bounds.iter().map(|b| {
            vec![
                format!("{:.3}", b.latency_bound_s),
                b.fcfs_tuned.as_ref().map_or("–".into(), |v| cores_cell(&v.run)),
                b.exegpt.as_ref().map_or("–".into(), |p| cores_cell(&p.verdict.run)),
            ]
        }),
    ));
    md
}

/// Where (c)'s time went over two devices (WAA runs): each device's busy share of the run and the
/// KV moved between them; empty when no run of (c) moved any.
fn device_time(w: &WorkloadResult) -> String {
    let rows: Vec<Vec<String>> = w
        .bounds
        .iter()
        .filter_map(|b| {
            let p = b.exegpt.as_ref().ok()?;
            let d = p.verdict.run.devices?;
            Some(vec![
                format!("{:.3}", b.latency_bound_s),
                format!("{:.0}%", 100.0 * d.prefill_busy),
                format!("{:.0}%", 100.0 * d.decode_busy),
                d.kv_transfers.to_string(),
                burn_llm::models::units::fmt_bytes(d.kv_transfer_bytes),
                format!("{:.3}", d.kv_transfer_s),
                format!("{:.1}%", 100.0 * d.kv_transfer_s / p.verdict.run.seconds),
            ])
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = "\nWhere (c)'s time went (WAA: each device's busy share of the run, the KV moved from the prefill \
                  device's pool to the decode device's):\n\n"
        .to_string();
    if let Some(waa) = &w.waa_interference {
        md = format!(
            "\nWAA priced at the two devices timed side by side on this workload's steps (a mean prompt's prefill \
             beside a decode step of the seat cap at the mean context): {}\n{md}",
            waa.summary(["prefill device", "decode device"])
        );
    }
    md.push_str(&table(
        &[
            ("bound s", Right),
            ("prefill device busy", Right),
            ("decode device busy", Right),
            ("KV hand-offs", Right),
            ("KV moved", Right),
            ("moving s", Right),
            ("moving / run", Right),
        ],
        rows,
    ));
    md
}

/// A plan's strategy, `B_E`, `N_D` (WAA has none: its encoder runs beside the decoder) and `B_D`.
pub(super) fn plan_shape(plan: &ScheduleOutput) -> String {
    let n_d = plan.decode_iterations.map_or("–".to_string(), |n| n.to_string());
    format!("{:?}: {}, {n_d}, {}", plan.strategy, plan.encode_batch, plan.decode_batch)
}
