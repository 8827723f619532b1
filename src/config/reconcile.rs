//! The `reconcile:` section: the live reconciler's alerts topic, scan interval and threshold.

use super::diagnostics::Collector;
use super::raw::RawReconcile;
use super::validate::{kafka_name, positive_duration, required};
use crate::topology::{ReconcileRun, ReconcileSettings};
use serde_saphyr::Spanned;
use std::time::Duration;

/// Checks `reconcile:`; `has_trace` tells whether the topology writes a trace topic to read.
pub fn reconcile(c: &mut Collector, raw: Spanned<RawReconcile>, has_trace: bool) -> Option<ReconcileSettings> {
    let at = raw.referenced;
    let r = raw.value;
    if !has_trace {
        c.at_loc(
            at,
            "`reconcile` reads the trace topic, but there is no `trace: { topic: … }` section",
        );
    }
    let alerts_topic = required(c, r.alerts_topic, Some(at), "`reconcile.alerts_topic` is required")
        .and_then(|t| kafka_name(c, &t, "reconcile.alerts_topic"));
    let mut duration = |t: Option<super::raw::Text>, default: Duration, what: &str| match t {
        None => Some(default),
        Some(t) => positive_duration(c, &t, what),
    };
    let scan_interval = duration(r.scan_interval, Duration::from_secs(300), "`reconcile.scan_interval`");
    let threshold = duration(r.threshold, Duration::from_secs(600), "`reconcile.threshold`");
    let run = match r.run.as_ref().map(|t| (t.value.as_str(), t.referenced)) {
        None | Some(("in_process", _)) => Some(ReconcileRun::InProcess),
        Some(("separately", _)) => Some(ReconcileRun::Separately),
        Some((other, at)) => {
            c.at_loc(
                at,
                format!("`reconcile.run` is `{other}`; use `in_process` or `separately`"),
            );
            None
        }
    };
    let settings = ReconcileSettings {
        alerts_topic: alerts_topic?,
        scan_interval: scan_interval?,
        threshold: threshold?,
        run: run?,
        watch: None,
    };
    has_trace.then_some(settings)
}
