//! Jobs of the mount daemon and the gateway whose process was killed: rebuilt from their
//! journals.

use roar_engine::journal::Orphan;
use roar_store::{Project, Writer};

use crate::config::Config;

pub fn recover(
    _project: &Project,
    _config: &Config,
    _writer: &Writer,
    _orphan: Orphan,
) -> anyhow::Result<Option<i64>> {
    Ok(None)
}
