//! One anchored chain head, as every sink stores it (a JSON line). Its
//! own module: the sinks and the anchoring loop both use it, and neither
//! should depend on the other for it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorLine {
    pub anchored_at: String,
    pub chain: String,
    pub seq: u64,
    pub hash: String,
}
