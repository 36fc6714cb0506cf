//! The requests of a placement input's workload: its explicit trace, or its gamma processes
//! generated from the seed.

use super::super::check::{self, InputError};
use super::super::sim::{self, Request};
use super::{MAX_REQUESTS, ModelRef, PlacementInput};

/// The requests of `input.workload`, in trace order (generated: arrival order).
pub(super) fn workload(input: &PlacementInput) -> Result<Vec<Request>, InputError> {
    let w = &input.workload;
    let resolve = |field: &str, r: &ModelRef| -> Result<usize, InputError> {
        match r {
            ModelRef::Index(i) if *i < input.models.len() => Ok(*i),
            ModelRef::Index(i) => Err(InputError::new(field, format!("model index {i} is out of range"))),
            ModelRef::Name(n) => input
                .models
                .iter()
                .position(|m| &m.name == n)
                .ok_or_else(|| InputError::new(field, format!("no model is named `{n}`"))),
        }
    };
    match (&w.trace, &w.arrivals) {
        (Some(trace), None) => {
            check::count("workload.trace", trace.len(), MAX_REQUESTS)?;
            trace
                .iter()
                .enumerate()
                .map(|(i, (t, m))| {
                    let field = format!("workload.trace[{i}]");
                    Ok(Request { arrival_s: check::non_negative(&field, *t)?, model: resolve(&field, m)? })
                })
                .collect()
        }
        (None, Some(arrivals)) => {
            let duration = check::positive(
                "workload.duration_s",
                w.duration_s.ok_or_else(|| {
                    InputError::new("workload.duration_s", "is missing; generated arrivals need a duration")
                })?,
            )?;
            let seed = w.seed.unwrap_or(0);
            let mut requests = Vec::new();
            for (i, a) in arrivals.iter().enumerate() {
                let f = |name: &str| format!("workload.arrivals[{i}].{name}");
                let model = resolve(&f("model"), &a.model)?;
                let rate = check::positive(&f("rate"), a.rate)?;
                let cv = check::non_negative(&f("cv"), a.cv)?;
                if rate * duration > MAX_REQUESTS as f64 {
                    return Err(InputError::new(f("rate"), format!("rate × duration exceeds {MAX_REQUESTS} requests")));
                }
                if cv > 1e3 {
                    return Err(InputError::new(f("cv"), "must be at most 1000"));
                }
                let left = MAX_REQUESTS - requests.len();
                let mut rng = sim::rng(seed, i as u64);
                let times = sim::gamma_arrivals(rate, cv, duration, left + 1, &mut rng);
                if times.len() > left {
                    return Err(InputError::new(
                        f("rate"),
                        format!("the workload has more than {MAX_REQUESTS} requests; lower the rates or the duration"),
                    ));
                }
                requests.extend(times.into_iter().map(|t| Request { arrival_s: t, model }));
            }
            requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
            Ok(requests)
        }
        _ => Err(InputError::new("workload", "give exactly one of `trace` and `arrivals`")),
    }
}
