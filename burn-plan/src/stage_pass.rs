//! One pipeline stage's pass, priced from its device's profile: what `--stage-layers auto`
//! predicts for each stage it plans, and what the pipeline benchmark holds measured stages
//! against. A stage runs its layers on its device (the profile's per-layer prefill or decode
//! time); the first stage also embeds the pass's tokens; the last applies the final norm and LM
//! head to the sequences it samples and pays the pass's fixed cost (`call_ms`: the
//! synchronisation that reads the logits); every other stage ends by handing its output to the
//! next, whose measured time holds that stage's synchronisation. The hand-over's time is the
//! caller's (it depends on the link and on what a model hands over).

use crate::profile::CostModel;

/// What a stage computes in one pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// A decode step of `batch` sequences, one new token each, after `context` cached tokens (a
    /// mean, so possibly fractional).
    Decode { batch: usize, context: f64 },
    /// One sequence's prefill of `tokens` tokens after `context` cached tokens.
    Prefill { tokens: usize, context: f64 },
}

impl Work {
    /// Tokens the pass computes: embedded on the first stage, handed over by the others.
    pub fn tokens(&self) -> usize {
        match *self {
            Self::Decode { batch, .. } => batch,
            Self::Prefill { tokens, .. } => tokens,
        }
    }

    /// Sequences whose logits the last stage computes (a prefill's last position only).
    pub fn logits(&self) -> usize {
        match *self {
            Self::Decode { batch, .. } => batch,
            Self::Prefill { .. } => 1,
        }
    }

    /// One layer's time for this pass on a device of cost model `cost`, ms.
    pub fn layer_ms(&self, cost: &CostModel) -> f64 {
        match *self {
            Self::Decode { batch, context } => cost.decode_layer_ms(batch as f64, context),
            Self::Prefill { tokens, context } => cost.prefill_layer_ms(1.0, tokens as f64, context),
        }
    }
}

/// Where a stage sits: how many layers it runs, and whether it is the first, the last stage (one
/// stage can be both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagePlace {
    /// Layers the stage runs.
    pub layers: usize,
    /// Whether it embeds the tokens.
    pub first: bool,
    /// Whether it applies the head and reads the logits.
    pub last: bool,
}

/// The time of `work` through a stage at `place` on a device of cost model `cost`, ms: its
/// layers, the embedding on the first stage, the head and the pass's fixed cost on the last, and
/// `handover_ms` (handing [`Work::tokens`] tokens to the next stage) on the others (see the
/// module docs).
pub fn stage_pass_ms(cost: &CostModel, place: StagePlace, work: Work, handover_ms: f64) -> f64 {
    let profile = cost.profile();
    let mut ms = work.layer_ms(cost) * place.layers as f64;
    if place.first {
        ms += profile.embedding.ms_per_token * work.tokens() as f64;
    }
    if place.last {
        ms += profile.lm_head.ms_per_token * work.logits() as f64 + profile.call_ms;
    } else {
        ms += handover_ms;
    }
    ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{DecodeTable, Extra, PROFILE_VERSION, PrefillTable, Profile};

    /// A layer costs 2 ms per prefill token and 1 + 0.5·b ms per decode step of `b` sequences;
    /// the embedding 0.1 ms per token, the head 3 ms per sequence, a pass's fixed cost 4 ms.
    fn cost() -> CostModel {
        Profile {
            version: PROFILE_VERSION,
            model: None,
            device: None,
            layers: 4,
            prefill: PrefillTable {
                batch: vec![1.0],
                tokens: vec![1.0, 8.0],
                base_ms: vec![vec![2.0, 16.0]],
                context_ms: [0.0; 4],
            },
            decode: DecodeTable {
                batch: vec![1.0, 4.0],
                context: vec![0.0, 64.0],
                ms: vec![vec![1.5, 1.5], vec![3.0, 3.0]],
            },
            weight_bytes_per_layer: 1,
            kv_bytes_per_token_per_layer: 1,
            embedding: Extra { weight_bytes: 1, ms_per_token: 0.1 },
            lm_head: Extra { weight_bytes: 1, ms_per_token: 3.0 },
            tensor_parallel: Vec::new(),
            engine_step: None,
            engine_step_ms: None,
            step_variation: None,
            call_ms: 4.0,
        }
        .cost_model("profile")
        .unwrap()
    }

    #[test]
    fn each_stage_pays_its_layers_and_its_place_in_the_pipeline() {
        let cost = cost();
        let prefill = Work::Prefill { tokens: 8, context: 0.0 };
        let decode = Work::Decode { batch: 4, context: 32.0 };
        let middle = StagePlace { layers: 2, first: false, last: false };
        // Two layers and the hand-over.
        assert_eq!(stage_pass_ms(&cost, middle, prefill, 5.0), 2.0 * 16.0 + 5.0);
        // The first stage embeds the 8 tokens too.
        let first = StagePlace { first: true, ..middle };
        assert!((stage_pass_ms(&cost, first, prefill, 5.0) - (32.0 + 0.8 + 5.0)).abs() < 1e-12);
        // The last runs the head over the prompt's last position and synchronises; no hand-over.
        let last = StagePlace { last: true, ..middle };
        assert_eq!(stage_pass_ms(&cost, last, prefill, 5.0), 32.0 + 3.0 + 4.0);
        // A decode step of 4 sequences: the head over every sequence.
        assert_eq!(stage_pass_ms(&cost, last, decode, 5.0), 2.0 * 3.0 + 4.0 * 3.0 + 4.0);
        let whole = StagePlace { layers: 4, first: true, last: true };
        assert!((stage_pass_ms(&cost, whole, decode, 5.0) - (12.0 + 0.4 + 12.0 + 4.0)).abs() < 1e-12);
    }
}
