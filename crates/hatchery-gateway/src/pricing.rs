//! Turning tokens into cents (the worst case of a call's input is `estimate.rs`).

use serde::Deserialize;
use std::collections::HashMap;

/// Price of one model, in US cents per million tokens.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
pub struct Price {
    pub input_cents_per_mtok: u64,
    pub output_cents_per_mtok: u64,
}

/// The operator's price table (a JSON file): `{"models": {name: Price},
/// "default": Price?}`. A model with no entry and no default is refused
/// before anything is reserved or sent upstream.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Prices {
    #[serde(default)]
    pub models: HashMap<String, Price>,
    #[serde(default)]
    pub default: Option<Price>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PricingError {
    #[error("model {0:?} has no price; the operator's price table does not list it")]
    UnknownModel(String),
}

impl Prices {
    pub fn price(&self, model: &str) -> Result<Price, PricingError> {
        self.models
            .get(model)
            .copied()
            .or(self.default)
            .ok_or_else(|| PricingError::UnknownModel(model.to_string()))
    }
}

impl Price {
    /// Cents for this usage, rounded up: a call is never charged less than
    /// it cost.
    pub fn cents(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        let milli = (input_tokens as u128) * (self.input_cents_per_mtok as u128)
            + (output_tokens as u128) * (self.output_cents_per_mtok as u128);
        milli.div_ceil(1_000_000) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cents_round_up_and_unknown_models_are_refused() {
        let p = Price {
            input_cents_per_mtok: 300,
            output_cents_per_mtok: 1500,
        };
        assert_eq!(p.cents(0, 0), 0);
        assert_eq!(p.cents(1, 0), 1, "a fraction of a cent is a cent");
        assert_eq!(p.cents(1_000_000, 1_000_000), 1800);
        let prices: Prices = serde_json::from_str(
            r#"{"models": {"m": {"input_cents_per_mtok": 1, "output_cents_per_mtok": 2}}}"#,
        )
        .unwrap();
        assert!(prices.price("m").is_ok());
        assert_eq!(
            prices.price("x"),
            Err(PricingError::UnknownModel("x".into()))
        );
    }
}
