pub mod code;
pub mod exec;
pub mod files;
pub mod meta;
pub mod network;
pub mod sandboxes;
pub mod snapshots;
pub mod templates;
