//! One module per subcommand.

pub mod check;
pub mod coord;
pub mod dump;
pub mod restore;
pub mod show;
