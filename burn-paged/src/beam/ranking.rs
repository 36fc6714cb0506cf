//! Scores and rankings computed the way PyTorch computes them, so that beam search ranks exactly
//! as Hugging Face does (see the "Ties" section of the [module docs](super)).

/// The score HF uses for "impossible": running scores of copies of the prompt, penalties of
/// candidates that may not continue / may not become hypotheses, empty hypothesis slots.
pub(super) const NEG_LARGE: f32 = -1.0e9;

/// `generated_len ^ length_penalty`, computed like Python's `int ** float` and then rounded to
/// `f32`, as PyTorch does when dividing a `float32` tensor by a Python float.
pub(super) fn length_denominator(generated_len: usize, length_penalty: f32) -> f32 {
    (generated_len as f64).powf(f64::from(length_penalty)) as f32
}

/// `torch.min` of the slot scores: NaN if any is NaN.
pub(super) fn torch_min(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(f32::INFINITY, |m, v| if m.is_nan() || v.is_nan() { f32::NAN } else { m.min(v) })
}

/// Whether `(value, index)` `a` ranks before `b`: higher value first, NaN above everything, then
/// lower index first.
fn ranks_before(a: (f32, usize), b: (f32, usize)) -> bool {
    match (a.0.is_nan(), b.0.is_nan()) {
        (true, true) => a.1 < b.1,
        (true, false) => true,
        (false, true) => false,
        (false, false) => a.0 > b.0 || (a.0 == b.0 && a.1 < b.1),
    }
}

/// The best `k` `(value, index)` pairs pushed, best first (see [`ranks_before`]).
pub(super) struct TopK {
    k: usize,
    pub(super) items: Vec<(f32, usize)>,
}

impl TopK {
    pub(super) fn new(k: usize) -> Self {
        Self { k, items: Vec::with_capacity(k.saturating_add(1).min(1024)) }
    }

    pub(super) fn push(&mut self, value: f32, index: usize) {
        let item = (value, index);
        if self.items.len() == self.k {
            match self.items.last() {
                Some(&last) if ranks_before(item, last) => {}
                _ => return,
            }
        }
        let pos = self.items.partition_point(|&x| ranks_before(x, item));
        self.items.insert(pos, item);
        self.items.truncate(self.k);
    }
}
