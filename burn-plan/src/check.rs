//! Input checks shared by every planner: each failure names the field and says what to do, so a
//! bad JSON file gives an error, never a panic or a silently wrong plan.

/// A field of a planner's input that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{field}`: {problem}")]
pub struct InputError {
    /// The input field, as spelled in the JSON input (`models[1].slo_s`).
    pub field: String,
    /// What is wrong with it and what to give instead.
    pub problem: String,
}

impl InputError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { field: field.into(), problem: problem.into() }
    }
}

/// A time or rate: finite and not negative.
pub fn non_negative(field: &str, value: f64) -> Result<f64, InputError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(InputError::new(field, format!("{value} is not a finite, non-negative number")))
    }
}

/// A quantity that must be finite and strictly positive (an SLO, a rate, a duration).
pub fn positive(field: &str, value: f64) -> Result<f64, InputError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(InputError::new(field, format!("{value} is not a finite, positive number")))
    }
}

/// A list of latencies: non-empty, every entry finite and not negative.
pub fn latencies(field: &str, values: &[f64]) -> Result<(), InputError> {
    if values.is_empty() {
        return Err(InputError::new(field, "is empty; give one entry per layer"));
    }
    for (i, &v) in values.iter().enumerate() {
        non_negative(&format!("{field}[{i}]"), v)?;
    }
    Ok(())
}

/// A count that must be at least 1 and at most `max` (which keeps the planners' tables small
/// enough to allocate).
pub fn count(field: &str, value: usize, max: usize) -> Result<usize, InputError> {
    if value == 0 {
        Err(InputError::new(field, "must be at least 1"))
    } else if value > max {
        Err(InputError::new(field, format!("{value} is larger than the supported maximum {max}")))
    } else {
        Ok(value)
    }
}

/// `values` must hold exactly `len` entries (one per layer, one per model…).
pub fn same_len<T>(field: &str, values: &[T], len: usize, what: &str) -> Result<(), InputError> {
    if values.len() == len {
        Ok(())
    } else {
        Err(InputError::new(field, format!("has {} entries but there are {len} {what}", values.len())))
    }
}
