//! One module per subcommand group.

pub mod audit;
pub mod cp;
pub mod env;
pub mod exec;
pub mod host;
pub mod network;
pub mod procs;
pub mod round;
pub mod run;
pub mod sandbox;
pub mod secret;
pub mod session;
pub mod shell;
pub mod snapshot;
pub mod template;
pub mod tenant;
pub mod terminal;
