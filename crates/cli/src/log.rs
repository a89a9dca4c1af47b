//! roar's diagnostic log on stderr: `ROAR_LOG`'s filter when it is set, else the warnings of
//! roar's own crates, with the formatter built at the first one ([`Warnings`]).

/// The log roar writes to stderr: `ROAR_LOG` (an env-filter: `debug`, `roar_store=trace`), else
/// only the warnings of roar's own crates and fuser ([`Warnings`]). s3s logs every client error
/// (NoSuchKey) at error level and the AWS SDK its config lookups, which under `roar run` would
/// land in the command's stderr.
pub fn init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    match std::env::var("ROAR_LOG") {
        Ok(directives) => match tracing_subscriber::EnvFilter::try_new(directives) {
            Ok(filter) => tracing_subscriber::registry()
                .with(fmt_layer())
                .with(filter)
                .init(),
            Err(e) => {
                eprintln!("roar: ROAR_LOG is not a log filter ({e}); logging warnings only");
                Warnings::default().init();
            }
        },
        Err(_) => Warnings::default().init(),
    }
}

/// How roar's log lines look: level, target, message and fields, no time; colour only for a
/// person at a terminal, and never with NO_COLOR (no-color.org).
fn fmt_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .without_time()
}

/// roar's log when `ROAR_LOG` is not set: the warnings and errors of roar's crates and fuser, in
/// [`fmt_layer`]'s format. The formatter (tracing_subscriber's registry, its slab of span slots)
/// is built at the first such line, which most commands never write: setting it up with a
/// target filter took ~0.1 ms of every `roar run`'s start (bench/NOTES.md). roar opens no spans
/// of its own; the spans of other crates are below this filter.
#[derive(Default)]
struct Warnings {
    formatter: std::sync::OnceLock<tracing::Dispatch>,
}

impl Warnings {
    /// Warnings and errors of roar's crates (`roar`, `roar_store`, ...: targets are module
    /// paths) and fuser.
    fn wanted(level: &tracing::Level, target: &str) -> bool {
        *level <= tracing::Level::WARN && ["roar", "fuser"].iter().any(|t| target.starts_with(t))
    }
}

impl tracing::Subscriber for Warnings {
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if Warnings::wanted(meta.level(), meta.target()) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        Warnings::wanted(meta.level(), meta.target())
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::WARN)
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        use tracing_subscriber::layer::SubscriberExt;
        self.formatter
            .get_or_init(|| tracing_subscriber::registry().with(fmt_layer()).into())
            .event(event);
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default log lets roar's own warnings through and nothing else: not its info, not the
    /// errors s3s logs for every client mistake. Its formatter is built at the first line it
    /// writes, not before.
    #[test]
    fn the_default_log_is_roars_warnings_alone() {
        use tracing::Level;
        let dispatch = tracing::Dispatch::new(Warnings::default());
        let built = |d: &tracing::Dispatch| {
            d.downcast_ref::<Warnings>()
                .expect("the Warnings subscriber")
                .formatter
                .get()
                .is_some()
        };
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info!(target: "roar::run_cmd", "not written");
            tracing::error!(target: "s3s::service", "not written");
        });
        assert!(!built(&dispatch));
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::warn!(target: "roar::run_cmd", "written by this test, on purpose");
        });
        assert!(built(&dispatch));
        let t = |target: &str, level: &Level| Warnings::wanted(level, target);
        for target in [
            "roar",
            "roar::run_cmd",
            "roar_store::writer",
            "roar_tracer::ebpf",
            "roar_roarfs::fs",
            "roar_gateway",
            "fuser::session",
        ] {
            assert!(t(target, &Level::WARN), "{target}");
            assert!(t(target, &Level::ERROR), "{target}");
            assert!(!t(target, &Level::INFO), "{target}");
        }
        for target in ["s3s::service", "aws_config::profile", "hyper", "rusqlite"] {
            assert!(!t(target, &Level::ERROR), "{target}");
        }
    }
}
