//! The spans of recent runs, kept in memory for ADK's web UI: its Trace tab and an event's
//! request and response (`GET /dev/apps/{app}/debug/trace/…`).
//!
//! [`KeepLayer`] sits in the subscriber beside the log lines (and the OpenTelemetry layer,
//! which is independent of it). It records each `run` span and every span under it (`agent`,
//! `chat`, `execute_tool`, `commit`, …) with its fields and times; when a span closes it goes
//! into the [`TraceBuffer`], which drops the oldest spans past its two bounds: a count
//! (`--trace-spans`) and [`MAX_BYTES`]. A field's text is cut at [`MAX_VALUE`].
//!
//! Kept per replica, as ADK's dev server keeps them: a session's trace is on the replica that
//! ran it. Traces across replicas, and kept for longer, are what OTLP export is for
//! (`--otlp-endpoint`). Spans are only recorded when the buffer is on, so a replica that keeps
//! none pays nothing for it.

use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Bytes of span text kept, at most (fields and annotations; the oldest spans go first).
pub const MAX_BYTES: usize = 32 << 20;
/// A field's or annotation's text is cut at this many bytes (a long conversation in a model
/// request, say).
pub const MAX_VALUE: usize = 64 << 10;

/// Whose run a span belongs to: the ids on its `run` span.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunIds {
    pub app: String,
    pub user: String,
    pub session: String,
    pub run: String,
    pub invocation: String,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct KeptSpan {
    /// The span's `tracing` name: `run`, `agent`, `chat`, `execute_tool`, `commit`, ….
    pub kind: &'static str,
    /// Its `otel.name` when it has one (`chat gpt-4o`), else its `tracing` name.
    pub name: String,
    /// Nanoseconds since the Unix epoch.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The run's: every span of one run shares it.
    pub trace_id: u64,
    pub span_id: u64,
    /// `None` for the run's own span.
    pub parent_span_id: Option<u64>,
    pub run: Arc<RunIds>,
    /// Its fields (but `otel.*`) and annotations ([`annotate`]).
    pub fields: Map<String, Value>,
}

/// The kept spans, oldest first.
pub struct TraceBuffer {
    max_spans: usize,
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    spans: VecDeque<(Arc<KeptSpan>, usize)>,
    bytes: usize,
}

impl TraceBuffer {
    pub fn new(max_spans: usize) -> Self {
        TraceBuffer {
            max_spans,
            inner: Mutex::new(Kept::default()),
        }
    }

    fn push(&self, span: KeptSpan) {
        let size = size_of(&span);
        let mut kept = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        kept.bytes += size;
        kept.spans.push_back((Arc::new(span), size));
        while kept.spans.len() > self.max_spans || kept.bytes > MAX_BYTES {
            match kept.spans.pop_front() {
                Some((_, size)) => kept.bytes -= size,
                None => break,
            }
        }
    }

    /// The kept spans `keep` accepts, oldest first.
    pub fn spans(&self, keep: impl Fn(&KeptSpan) -> bool) -> Vec<Arc<KeptSpan>> {
        let kept = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        kept.spans
            .iter()
            .filter(|(s, _)| keep(s))
            .map(|(s, _)| s.clone())
            .collect()
    }
}

/// About what a span holds on to, in bytes.
fn size_of(span: &KeptSpan) -> usize {
    let text = |v: &Value| match v {
        Value::String(s) => s.len(),
        _ => 8,
    };
    let ids = &span.run;
    160 + span.name.len()
        + ids.app.len()
        + ids.user.len()
        + ids.session.len()
        + ids.run.len()
        + ids.invocation.len()
        + span
            .fields
            .iter()
            .map(|(k, v)| k.len() + text(v))
            .sum::<usize>()
}

static BUFFER: OnceLock<Arc<TraceBuffer>> = OnceLock::new();

/// Turns the buffer on, keeping `max_spans` spans; the layer to add to the subscriber. `None`
/// for 0, or when it is on already.
pub fn keep(max_spans: usize) -> Option<KeepLayer> {
    if max_spans == 0 {
        return None;
    }
    let buffer = Arc::new(TraceBuffer::new(max_spans));
    BUFFER.set(buffer.clone()).ok()?;
    Some(KeepLayer { buffer })
}

/// The kept spans, when the buffer is on.
pub fn kept() -> Option<&'static TraceBuffer> {
    BUFFER.get().map(Arc::as_ref)
}

/// Adds `key` to `span`'s kept fields (and only there: it is not a `tracing` field, so no log
/// line or OTLP export carries it). `value` is computed only when the span is being kept: a
/// model request's JSON costs nothing on a replica that keeps no traces.
pub fn annotate(span: &tracing::Span, key: &'static str, value: impl FnOnce() -> Value) {
    if BUFFER.get().is_none() {
        return;
    }
    span.with_subscriber(|(id, dispatch)| {
        let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
            return;
        };
        let Some(span) = registry.span(id) else {
            return;
        };
        let mut ext = span.extensions_mut();
        if let Some(rec) = ext.get_mut::<Recording>() {
            rec.fields.insert(key.to_string(), cut(value()));
        }
    });
}

/// Records the spans of runs into the buffer ([`keep`]).
pub struct KeepLayer {
    buffer: Arc<TraceBuffer>,
}

/// A span being recorded (in the registry's extensions until it closes).
struct Recording {
    kind: &'static str,
    name: String,
    start_ns: u64,
    trace_id: u64,
    span_id: u64,
    parent_span_id: Option<u64>,
    run: Arc<RunIds>,
    fields: Map<String, Value>,
}

impl<S> tracing_subscriber::Layer<S> for KeepLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let kind = attrs.metadata().name();
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let (run, trace_id, parent_span_id) = if kind == "run" {
            let ids = RunIds {
                app: fields.take("app"),
                user: fields.take("user"),
                session: fields.take("session"),
                run: fields.take("run"),
                invocation: fields.take("invocation"),
            };
            (Arc::new(ids), next_id(), None)
        } else {
            // Only spans under a run's span are kept.
            let Some(parent) = span.parent() else {
                return;
            };
            let ext = parent.extensions();
            let Some(p) = ext.get::<Recording>() else {
                return;
            };
            (p.run.clone(), p.trace_id, Some(p.span_id))
        };
        let name = fields.name.take().unwrap_or_else(|| kind.to_string());
        span.extensions_mut().insert(Recording {
            kind,
            name,
            start_ns: now_ns(),
            trace_id,
            span_id: next_id(),
            parent_span_id,
            run,
            fields: fields.map,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut ext = span.extensions_mut();
        let Some(rec) = ext.get_mut::<Recording>() else {
            return;
        };
        let mut fields = Fields {
            map: std::mem::take(&mut rec.fields),
            name: None,
        };
        values.record(&mut fields);
        rec.fields = fields.map;
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(rec) = span.extensions_mut().remove::<Recording>() else {
            return;
        };
        self.buffer.push(KeptSpan {
            kind: rec.kind,
            name: rec.name,
            start_ns: rec.start_ns,
            end_ns: now_ns(),
            trace_id: rec.trace_id,
            span_id: rec.span_id,
            parent_span_id: rec.parent_span_id,
            run: rec.run,
            fields: rec.fields,
        });
    }
}

/// A span's fields as JSON values; `otel.name` apart, other `otel.*` left out.
#[derive(Default)]
struct Fields {
    map: Map<String, Value>,
    name: Option<String>,
}

impl Fields {
    fn take(&mut self, key: &str) -> String {
        match self.map.remove(key) {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }

    fn put(&mut self, field: &Field, value: Value) {
        let key = field.name();
        if key == "otel.name" {
            self.name = value.as_str().map(str::to_string);
        } else if !key.starts_with("otel.") {
            self.map.insert(key.to_string(), cut(value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%x` fields arrive here too, formatted as Display.
        self.put(field, Value::String(format!("{value:?}")));
    }
}

/// `value`, its text cut at [`MAX_VALUE`] bytes (on a character boundary, marked with `…`).
fn cut(value: Value) -> Value {
    let text = match value {
        Value::String(s) => s,
        Value::Null | Value::Bool(_) | Value::Number(_) => return value,
        other => other.to_string(),
    };
    if text.len() <= MAX_VALUE {
        return Value::String(text);
    }
    let mut end = MAX_VALUE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Value::String(format!("{}…", &text[..end]))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A fresh span or trace id: nonzero and below 2^53, so that a browser's JSON numbers hold it
/// exactly (the web UI matches parents to children by id).
fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| now_ns() ^ u64::from(std::process::id()) << 32);
    // splitmix64 of a counter: distinct for 2^64 calls, spread over the whole range.
    let mut z = seed.wrapping_add(
        NEXT.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(fields: Map<String, Value>) -> KeptSpan {
        KeptSpan {
            kind: "chat",
            name: "chat m".into(),
            start_ns: 1,
            end_ns: 2,
            trace_id: 1,
            span_id: next_id(),
            parent_span_id: None,
            run: Arc::new(RunIds::default()),
            fields,
        }
    }

    #[test]
    fn the_buffer_drops_the_oldest_past_its_count() {
        let b = TraceBuffer::new(3);
        for i in 0..5 {
            let mut f = Map::new();
            f.insert("i".into(), i.into());
            b.push(span(f));
        }
        let left: Vec<_> = b
            .spans(|_| true)
            .iter()
            .map(|s| s.fields["i"].clone())
            .collect();
        assert_eq!(left, vec![Value::from(2), Value::from(3), Value::from(4)]);
    }

    #[test]
    fn the_buffer_drops_the_oldest_past_its_bytes() {
        let b = TraceBuffer::new(usize::MAX);
        let big = "x".repeat(MAX_VALUE);
        let n = MAX_BYTES / MAX_VALUE + 10;
        for _ in 0..n {
            let mut f = Map::new();
            f.insert("text".into(), cut(Value::String(big.clone())));
            b.push(span(f));
        }
        let kept = b.spans(|_| true).len();
        assert!(kept < n && kept > 0, "{kept} of {n} kept");
        let bytes: usize = b.spans(|_| true).iter().map(|s| size_of(s)).sum();
        assert!(bytes <= MAX_BYTES, "{bytes} bytes kept");
    }

    #[test]
    fn a_long_value_is_cut_on_a_character_boundary() {
        let text = "é".repeat(MAX_VALUE);
        let Value::String(cut) = cut(Value::String(text)) else {
            panic!("not a string");
        };
        assert!(cut.len() <= MAX_VALUE + "…".len());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn ids_are_distinct_and_fit_a_javascript_number() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| next_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|&i| i > 0 && i < (1 << 53)));
    }
}
