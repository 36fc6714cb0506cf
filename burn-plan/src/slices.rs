//! Token slicing (TeraPipe, thesis ch. 2 §2.3.3): split a prompt of `L` tokens into slices
//! `l_1, …, l_M` for a `K`-stage pipeline minimising `T = Σ t_i + (K−1)·max t_i` with
//! `t_i = t_fwd(l_i, l_1+…+l_{i−1})` (Eq. 2.5).
//!
//! Algorithm 1 with the t_max enumeration of Eq. 2.6: for each candidate `t_max` (every distinct
//! `t_fwd(i, j)`, smallest first) the DP `S*(i; t_max) = min_k S*(i−k; t_max) + t_fwd(k, i−k)`
//! over slices no slower than `t_max` gives the least total time; `T*(t_max) = S*(L) + (K−1)·t_max`.
//! The enumeration stops once `K·t_max` reaches the best `T` (no later `t_max` can beat it), and
//! with `epsilon_ms > 0` only evaluates a `t_max` at least ε above the last one evaluated (the
//! result is then within `K·ε` of the optimum; ε = 0 gives the exact optimum).
//!
//! Interference: devices that slow each other while they compute at once (two workers on one
//! host's cores, a host stage beside a worker) stretch the work the pipeline overlaps. With the
//! devices' measured interference `κ` (optional `"interference"`, default 0: TeraPipe's model),
//! a slicing costs `T = Σ t_i + (K−1)·max t_i + κ·(K−1)·(Σ t_i − max t_i)`
//! ([`pipelined_latency_ms`]): every slice but the slowest overlaps the other `K−1` stages' work,
//! and `κ` prices that overlap as a micro-batch's interval `max t + κ·(Σ t − max t)` does
//! ([`Interference`](crate::interference::Interference)); `M` equal slices cost exactly `M` equal micro-batches.
//! For a given `t_max`, `T` still grows with `S*`, so Algorithm 1 is unchanged and only the outer
//! choice of `t_max` weighs `κ`; `T ≥ K·t_max` still holds for the slicing whose slowest slice
//! is `t_max`, so the early stop stands.
//!
//! [`plan_batch`] adds the batch dimension (§2.3.4): the optimum `T_b` for every micro-batch
//! size `b ≤ B`, then a 1-D knapsack choosing sizes `b_1 + … + b_D = B` that minimise `Σ T_{b_d}`.

use serde::{Deserialize, Serialize};

use super::check::{self, InputError};
use super::profile::{CostModel, Profile};

/// Largest number of slicing units (tokens, or `unit_tokens` groups) the DP accepts.
const MAX_UNITS: usize = 4096;
/// Most slice times held at once (all micro-batch sizes together).
const MAX_TABLE_ENTRIES: usize = 1 << 24;

/// Input of [`plan`] and [`plan_batch`]. JSON: `{"seq_len": L, "stages": K, "t_fwd_ms": [[f64;
/// L]; L]}` (or `"profile"` instead of `"t_fwd_ms"`), optional `"epsilon_ms"`, `"unit_tokens"`;
/// for the batch extension also `"batch": B`, with `"t_fwd_ms_by_batch"` instead of `"t_fwd_ms"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlicesInput {
    /// Prompt length `L` in tokens (of every sequence).
    pub seq_len: usize,
    /// Pipeline stages `K`.
    pub stages: usize,
    /// `t_fwd_ms[i−1][j]`: time of a slice of `i` tokens after `j` tokens of context on one
    /// stage; entries with `i + j > L` are ignored (and may be `null`).
    #[serde(default)]
    pub t_fwd_ms: Option<Vec<Vec<Option<f64>>>>,
    /// A profile instead of the table(s): a stage holds `layers / K` layers, so its slice time is
    /// that many times the profile's per-layer prefill time (at batch 1, or at each micro-batch
    /// size `b`).
    #[serde(default)]
    pub profile: Option<Profile>,
    /// ε of the t_max enumeration (default 0: exact).
    #[serde(default)]
    pub epsilon_ms: Option<f64>,
    /// With a profile: slice lengths are multiples of this many tokens (default 1), which keeps
    /// the DP small for long prompts. `seq_len` must be a multiple of it.
    #[serde(default)]
    pub unit_tokens: Option<usize>,
    /// The stage devices' interference `κ` (see the module docs; default 0).
    #[serde(default)]
    pub interference: Option<f64>,
    /// [`plan_batch`]: sequences in the batch `B`.
    #[serde(default)]
    pub batch: Option<usize>,
    /// [`plan_batch`]: `t_fwd_ms_by_batch[b−1]` is the `t_fwd_ms` table of a micro-batch of `b`
    /// sequences.
    #[serde(default)]
    pub t_fwd_ms_by_batch: Option<Vec<Vec<Vec<Option<f64>>>>>,
}

/// Output of [`plan`]: `{"slices": [l_1, …, l_M], "latency_ms": T}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlicesOutput {
    /// Slice lengths in tokens, in prompt order, summing to `seq_len`.
    pub slices: Vec<usize>,
    /// [`pipelined_latency_ms`] of these slices: `Σ t_i + (K−1)·max t_i`, plus the interference
    /// term when `κ > 0`.
    pub latency_ms: f64,
}

/// Output of [`plan_batch`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchSlicesOutput {
    /// The micro-batches, largest first, each with its own token slicing.
    pub micro_batches: Vec<MicroBatchSlices>,
    /// `Σ T_{b_d}` (§2.3.4's objective).
    pub latency_ms: f64,
}

/// One micro-batch of a [`BatchSlicesOutput`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MicroBatchSlices {
    /// Sequences in the micro-batch.
    pub batch: usize,
    /// Its token slices.
    pub slices: Vec<usize>,
    /// Its optimal `T_b`.
    pub latency_ms: f64,
}

/// Why no slicing could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SlicesError {
    /// A field cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Slice times in slicing units: `t(k, j)` for a slice of `k` units after `j` units.
struct Table {
    units: usize,
    /// Row `k−1` holds `t(k, 0..=units−k)`.
    rows: Vec<Vec<f64>>,
}

impl Table {
    fn t(&self, k: usize, j: usize) -> f64 {
        self.rows[k - 1][j]
    }

    fn from_json(field: &str, rows: &[Vec<Option<f64>>], seq_len: usize) -> Result<Self, InputError> {
        check::same_len(field, rows, seq_len, "tokens in `seq_len`")?;
        let mut out = Vec::with_capacity(seq_len);
        for (r, row) in rows.iter().enumerate() {
            let i = r + 1;
            let needed = seq_len - i + 1;
            let row_field = format!("{field}[{r}]");
            if row.len() < needed {
                return Err(InputError::new(
                    row_field,
                    format!("has {} entries; a slice of {i} tokens needs contexts 0..={}", row.len(), seq_len - i),
                ));
            }
            let mut vals = Vec::with_capacity(needed);
            for (j, v) in row[..needed].iter().enumerate() {
                let name = format!("{row_field}[{j}]");
                let v = v.ok_or_else(|| InputError::new(&name, "is null but i + j ≤ seq_len uses it"))?;
                vals.push(check::non_negative(&name, v)?);
            }
            out.push(vals);
        }
        Ok(Self { units: seq_len, rows: out })
    }

    fn from_profile(model: &CostModel, stages: usize, batch: usize, units: usize, unit: usize) -> Self {
        let layers_per_stage = model.profile().layers as f64 / stages as f64;
        let rows = (1..=units)
            .map(|k| {
                (0..=units - k)
                    .map(|j| {
                        layers_per_stage * model.prefill_layer_ms(batch as f64, (k * unit) as f64, (j * unit) as f64)
                    })
                    .collect()
            })
            .collect();
        Self { units, rows }
    }
}

/// Plans the slices for `input` (see the module docs).
pub fn plan(input: &SlicesInput) -> Result<SlicesOutput, SlicesError> {
    if input.batch.is_some() || input.t_fwd_ms_by_batch.is_some() {
        return Err(InputError::new(
            "batch",
            "asks for the batch extension: use `plan_batch` (the CLI does when `batch` is given)",
        )
        .into());
    }
    let common = Common::check(input)?;
    let table = match (&input.t_fwd_ms, &input.profile) {
        (Some(rows), None) => {
            common.table_only(input.unit_tokens)?;
            Table::from_json("t_fwd_ms", rows, input.seq_len)?
        }
        (None, Some(profile)) => {
            let model = profile.cost_model("profile")?;
            Table::from_profile(&model, input.stages, 1, common.units, common.unit)
        }
        _ => return Err(one_source_error("t_fwd_ms").into()),
    };
    let (slices, latency_ms) = optimal_slices(&table, input.stages, &common);
    Ok(SlicesOutput { slices: slices.into_iter().map(|k| k * common.unit).collect(), latency_ms })
}

/// Plans micro-batches and their slices for `input` (§2.3.4).
pub fn plan_batch(input: &SlicesInput) -> Result<BatchSlicesOutput, SlicesError> {
    let common = Common::check(input)?;
    let batch = input.batch.ok_or_else(|| InputError::new("batch", "is missing; the batch extension needs it"))?;
    let batch = check::count("batch", batch, MAX_UNITS)?;
    if input.t_fwd_ms.is_some() {
        return Err(InputError::new("t_fwd_ms", "is for one sequence; give `t_fwd_ms_by_batch` with `batch`").into());
    }
    let entries = batch.saturating_mul(common.units * (common.units + 1) / 2);
    if entries > MAX_TABLE_ENTRIES {
        return Err(InputError::new(
            "batch",
            format!("{entries} table entries for {} micro-batch sizes are more than {MAX_TABLE_ENTRIES}; set `unit_tokens` or a smaller batch", batch),
        )
        .into());
    }
    let tables: Vec<Table> = match (&input.t_fwd_ms_by_batch, &input.profile) {
        (Some(by_batch), None) => {
            common.table_only(input.unit_tokens)?;
            check::same_len("t_fwd_ms_by_batch", by_batch, batch, "micro-batch sizes in `batch`")?;
            by_batch
                .iter()
                .enumerate()
                .map(|(b, rows)| Table::from_json(&format!("t_fwd_ms_by_batch[{b}]"), rows, input.seq_len))
                .collect::<Result<_, _>>()?
        }
        (None, Some(profile)) => {
            let model = profile.cost_model("profile")?;
            (1..=batch).map(|b| Table::from_profile(&model, input.stages, b, common.units, common.unit)).collect()
        }
        _ => return Err(one_source_error("t_fwd_ms_by_batch").into()),
    };
    let per_size: Vec<(Vec<usize>, f64)> = tables.iter().map(|t| optimal_slices(t, input.stages, &common)).collect();
    // Knapsack: best[n] = min_b best[n − b] + T_b.
    let mut best = vec![(0.0f64, 0usize); batch + 1];
    for n in 1..=batch {
        best[n] = (1..=n)
            .map(|b| (best[n - b].0 + per_size[b - 1].1, b))
            .min_by(|x, y| x.0.total_cmp(&y.0))
            .unwrap_or((f64::INFINITY, 1));
    }
    let mut sizes = Vec::new();
    let mut n = batch;
    while n > 0 {
        sizes.push(best[n].1);
        n -= best[n].1;
    }
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    Ok(BatchSlicesOutput {
        micro_batches: sizes
            .into_iter()
            .map(|b| MicroBatchSlices {
                batch: b,
                slices: per_size[b - 1].0.iter().map(|k| k * common.unit).collect(),
                latency_ms: per_size[b - 1].1,
            })
            .collect(),
        latency_ms: best[batch].0,
    })
}

fn one_source_error(table: &str) -> InputError {
    InputError::new(table, format!("give exactly one of `{table}` and `profile`"))
}

/// Checked fields shared by both inputs.
struct Common {
    units: usize,
    unit: usize,
    epsilon: f64,
    kappa: f64,
}

impl Common {
    fn check(input: &SlicesInput) -> Result<Self, InputError> {
        let seq_len = check::count("seq_len", input.seq_len, usize::MAX)?;
        check::count("stages", input.stages, 1 << 20)?;
        let epsilon = check::non_negative("epsilon_ms", input.epsilon_ms.unwrap_or(0.0))?;
        let kappa = check::non_negative("interference", input.interference.unwrap_or(0.0))?;
        let unit = check::count("unit_tokens", input.unit_tokens.unwrap_or(1), seq_len)?;
        if !seq_len.is_multiple_of(unit) {
            return Err(InputError::new("unit_tokens", format!("{unit} does not divide `seq_len` {seq_len}")));
        }
        let units = seq_len / unit;
        if units > MAX_UNITS {
            return Err(InputError::new(
                "seq_len",
                format!("{units} slicing units are more than {MAX_UNITS}; set `unit_tokens` to group tokens"),
            ));
        }
        Ok(Self { units, unit, epsilon, kappa })
    }

    fn table_only(&self, unit: Option<usize>) -> Result<(), InputError> {
        match unit {
            Some(u) if u != 1 => Err(InputError::new("unit_tokens", "only applies with `profile`")),
            _ => Ok(()),
        }
    }
}

/// TeraPipe's `T` (Eq. 2.5) of slices whose times on the slowest stage are `times`, over `stages`
/// stages whose devices interfere by `kappa`: `Σ t_i + (K−1)·max t_i + κ·(K−1)·(Σ t_i − max t_i)`
/// (see the module docs; `κ = 0` is Eq. 2.5).
pub fn pipelined_latency_ms(times: impl IntoIterator<Item = f64>, stages: usize, kappa: f64) -> f64 {
    let (sum, max) = times.into_iter().fold((0.0f64, 0.0f64), |(sum, max), t| (sum + t, max.max(t)));
    let overlap = stages.saturating_sub(1) as f64;
    sum + overlap * max + kappa.max(0.0) * overlap * (sum - max)
}

/// [`pipelined_latency_ms`] of a slicing read from `table`.
fn pipeline_latency(table: &Table, slices: &[usize], stages: usize, kappa: f64) -> f64 {
    let mut context = 0;
    let times = slices.iter().map(|&k| {
        let t = table.t(k, context);
        context += k;
        t
    });
    pipelined_latency_ms(times, stages, kappa)
}

/// Algorithm 1 with the t_max enumeration, early stop and ε pruning.
fn optimal_slices(table: &Table, stages: usize, common: &Common) -> (Vec<usize>, f64) {
    let (n, epsilon, kappa) = (table.units, common.epsilon, common.kappa);
    let mut candidates: Vec<f64> = table.rows.iter().flatten().copied().collect();
    candidates.sort_by(f64::total_cmp);
    candidates.dedup();
    let mut best: Option<(Vec<usize>, f64)> = None;
    let mut last_evaluated = f64::NEG_INFINITY;
    let mut s = vec![f64::INFINITY; n + 1];
    let mut q = vec![0usize; n + 1];
    for (ci, &t_max) in candidates.iter().enumerate() {
        if let Some((_, b)) = &best
            && stages as f64 * t_max >= *b
        {
            break;
        }
        // The largest candidate is always evaluated: it admits every slicing.
        if ci + 1 < candidates.len() && t_max < last_evaluated + epsilon {
            continue;
        }
        last_evaluated = t_max;
        s[0] = 0.0;
        for i in 1..=n {
            s[i] = f64::INFINITY;
            for k in 1..=i {
                let t = table.t(k, i - k);
                if t <= t_max && s[i - k] + t < s[i] {
                    s[i] = s[i - k] + t;
                    q[i] = k;
                }
            }
        }
        if !s[n].is_finite() {
            continue;
        }
        let mut slices = Vec::new();
        let mut i = n;
        while i > 0 {
            slices.push(q[i]);
            i -= q[i];
        }
        slices.reverse();
        let latency = pipeline_latency(table, &slices, stages, kappa);
        if best.as_ref().is_none_or(|(_, b)| latency < *b) {
            best = Some((slices, latency));
        }
    }
    // Non-empty: the last candidate admits the single slice of all units.
    best.unwrap_or_else(|| (vec![n], pipeline_latency(table, &[n], stages, kappa)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(n: usize, f: impl Fn(usize, usize) -> f64) -> Table {
        Table { units: n, rows: (1..=n).map(|k| (0..=n - k).map(|j| f(k, j)).collect()).collect() }
    }

    /// The exact optimum (ε = 0) at interference `kappa`.
    fn exact(kappa: f64) -> Common {
        Common { units: 0, unit: 1, epsilon: 0.0, kappa }
    }

    #[test]
    fn slices_constant_overhead_prefers_one_slice_when_pipeline_is_one_stage() {
        let t = table(8, |k, _| 1.0 + k as f64);
        let (slices, latency) = optimal_slices(&t, 1, &exact(0.0));
        assert_eq!(slices, vec![8]);
        assert_eq!(latency, 9.0);
    }

    #[test]
    fn slices_pipeline_prefers_several_slices() {
        // Linear cost, no overhead: with 4 stages finer slices shrink the bubble.
        let t = table(8, |k, _| k as f64);
        let (slices, latency) = optimal_slices(&t, 4, &exact(0.0));
        assert_eq!(slices, vec![1; 8]);
        assert_eq!(latency, 8.0 + 3.0);
    }

    #[test]
    fn interference_prices_the_overlap_and_can_make_one_pass_best() {
        // M equal slices over K stages cost what M equal micro-batches do.
        let (m, k, t, kappa) = (5usize, 3usize, 2.0, 0.4);
        let micro = k as f64 * t + (m - 1) as f64 * (t + kappa * (k - 1) as f64 * t);
        let sliced = pipelined_latency_ms(vec![t; m], k, kappa);
        assert!((sliced - micro).abs() < 1e-12, "{sliced} vs {micro}");
        assert_eq!(pipelined_latency_ms([1.0, 3.0], 2, 0.0), 4.0 + 3.0);
        // A fixed cost of 1 per slice plus 1 per unit, 2 stages. At κ = 0 slicing pays
        // (2 slices of 4: 10 + 5 = 15 against one pass's 9 + 9 = 18); at κ = 1 every overlapped
        // unit costs twice, and one pass is best.
        let t = table(8, |k, _| 1.0 + k as f64);
        let (free, free_ms) = optimal_slices(&t, 2, &exact(0.0));
        assert!(free.len() > 1, "{free:?}");
        let (costly, costly_ms) = optimal_slices(&t, 2, &exact(1.0));
        assert_eq!(costly, vec![8]);
        assert_eq!(costly_ms, 18.0);
        assert!(free_ms < costly_ms);
        // The interference field is checked like every other.
        let input = SlicesInput {
            seq_len: 2,
            stages: 2,
            t_fwd_ms: Some(vec![vec![Some(1.0), Some(1.0)], vec![Some(1.5)]]),
            interference: Some(-0.5),
            ..SlicesInput::default()
        };
        assert!(plan(&input).unwrap_err().to_string().contains("interference"));
    }
}
