//! A progress line on stderr while keys are read, shown only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// What the current phase has counted; a no-op off a terminal.
pub struct Progress {
    bar: Option<ProgressBar>,
    what: String,
    unit: &'static str,
}

impl Progress {
    /// Starts a phase called `what` counting `unit`s; `enabled` and a terminal on stderr are
    /// both needed to show it.
    pub fn start(what: &str, unit: &'static str, enabled: bool) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template(&format!("{{spinner}} {{msg}}: {{human_pos}} {unit} ({{elapsed}})"))
                    .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(what.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            what: what.to_string(),
            unit,
        }
    }

    /// Counts one.
    pub fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Ends the phase, leaving a line with its final count on the terminal.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
            eprintln!(
                "{}: {} {} in {:.1} s",
                self.what,
                bar.position(),
                self.unit,
                bar.elapsed().as_secs_f64()
            );
        }
    }
}
