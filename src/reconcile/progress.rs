//! A progress line on stderr while keys are read, shown only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Records counted in the current phase; a no-op off a terminal.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Starts a phase called `what`; `enabled` and a terminal on stderr are both needed to show it.
    pub fn start(what: &str, enabled: bool) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{spinner} {msg}: {human_pos} records ({per_sec}, {elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(what.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        });
        Self { bar }
    }

    /// Counts one record.
    pub fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Ends the phase, leaving its final count on the terminal.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish();
        }
    }
}
