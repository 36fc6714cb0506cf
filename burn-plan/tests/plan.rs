//! The planners against brute force on seeded random inputs, the papers' qualitative claims,
//! hand-computed simulator timelines, and bad input through the library and the JSON entry
//! point ([`burn_plan::json`]).

#[path = "plan/stage_devices.rs"]
mod stage_devices;

#[path = "plan/stage_groups.rs"]
mod stage_groups;

#[path = "plan/serve_every_model.rs"]
mod serve_every_model;

#[path = "plan/measured_pipelines.rs"]
mod measured_pipelines;

#[path = "plan/slo_admission.rs"]
mod slo_admission;

#[path = "plan/stages.rs"]
mod stages;

#[path = "plan/slices.rs"]
mod slices;

#[path = "plan/profiles.rs"]
mod profiles;

#[path = "plan/placement.rs"]
mod placement;

#[path = "plan/schedule.rs"]
mod schedule;

#[path = "plan/schedule_steps.rs"]
mod schedule_steps;

#[path = "plan/bad_input.rs"]
mod bad_input;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}
