//! TCP connections relayed over the agent channel, both ways: the host
//! opens one to a port inside the guest (port previews), or a guest program
//! connects to a host service listener the agent holds on guest loopback.
//!
//! Each connection is one channel. Bytes travel as `RelayData` /
//! `RelayGuestData` frames; `RelayShut` / `RelayGuestShut` half-close;
//! `RelayClose` / `RelayGuestClose` abort. Flow control is a credit window
//! per direction: a sender may have at most [`WINDOW`] of cost in flight
//! that the receiver has not acknowledged with a window frame (u32 BE
//! payload). Every data frame costs at least [`MIN_COST`], so the number
//! of frames in flight is bounded too and a receiver can size its queue to
//! never block: one slow connection cannot stall the channel's others.

use serde::{Deserialize, Serialize};

/// Credit each side starts with, per connection and direction.
pub const WINDOW: u32 = 1024 * 1024;
/// Least credit a data frame costs, whatever its size.
pub const MIN_COST: u32 = 4 * 1024;
/// Largest data frame payload either side sends.
pub const CHUNK: usize = 256 * 1024;
/// Data frames of one direction that can be in flight at once.
pub const MAX_FRAMES_IN_FLIGHT: usize = (WINDOW / MIN_COST) as usize;
/// Set in the channel id of connections the guest started, so they never
/// collide with the host's ids (which have it clear).
pub const GUEST_CHANNEL_BIT: u32 = 0x8000_0000;
/// Acknowledge consumed credit once this much has piled up.
pub const ACK_EVERY: u32 = WINDOW / 4;

/// What a data frame of `n` payload bytes costs.
pub fn cost(n: usize) -> u32 {
    (n.min(u32::MAX as usize) as u32).max(MIN_COST)
}

/// The payload of a window frame.
pub fn window_payload(n: u32) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

/// Credit carried by a window frame; `None` if malformed.
pub fn parse_window(payload: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(payload.try_into().ok()?))
}

/// The set of guest loopback ports the agent listens on for host
/// services. `reset` is set by a newly attached host: relayed connections
/// of an earlier host connection (a previous daemon, or the sandbox a
/// snapshot was taken of) are dropped and every listener is bound afresh,
/// which is what a restored checkpoint needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayListen {
    pub ports: Vec<u16>,
    pub reset: bool,
}

/// The agent's answer to [`RelayListen`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayListening {
    pub listening: Vec<u16>,
    /// Ports that could not be bound, with why (a guest program holding
    /// the port, say).
    pub failed: Vec<(u16, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayOpen {
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RelayIncoming {
    /// The listener's guest port, which names the host service.
    pub port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_has_a_floor_and_the_window_bounds_frames() {
        assert_eq!(cost(1), MIN_COST);
        assert_eq!(cost(CHUNK), CHUNK as u32);
        assert_eq!(MAX_FRAMES_IN_FLIGHT, 256);
        assert_eq!(parse_window(&window_payload(77)), Some(77));
        assert_eq!(parse_window(b"abc"), None);
    }
}
