//! The fencing story as a picture: a [`Timeline`] of who sent what to whom, with epochs, drawn
//! as an SVG sequence diagram ([`Timeline::to_svg`], `minibroker demo --timeline out.svg`).
//!
//! One lifeline per participant (instances A and B, the coordinator that owns the transactional
//! id, the partition leaders), one row per event, top to bottom in the order the story made
//! them: requests (black), replies (grey), rejections (red, with the error code), transaction
//! markers (purple, dashed) and the markers that fence an older instance (orange, bold), and
//! notes (a GC pause, the verdict).
//!
//! The tale records what it sent and what it was answered; the markers are drawn where the
//! protocol puts them (after an EndTxn, or after the new instance's InitProducerId fenced an
//! open transaction), with the epoch the coordinator answered with, which is the epoch they
//! carry (PROTOCOL.md sections 4 and 6).
//!
//! CAVEATS: no timestamps on the rows (the order is the story's); retries inside the client
//! library (CONCURRENT_TRANSACTIONS while the fence completes) are not drawn one by one.

use std::fmt::Write as _;

/// What an arrow (or box) stands for; decides its colour and line style.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request.
    Request,
    /// A successful reply.
    Reply,
    /// A request refused with an error code.
    Rejected,
    /// A transaction marker (WriteTxnMarkers).
    Marker,
    /// A marker that aborts an older instance's transaction: the fence.
    Fence,
    /// A note on one lifeline.
    Note,
}

/// One row of the diagram.
#[derive(Clone, Debug)]
pub struct Event {
    /// The lane it starts from.
    pub from: usize,
    /// The lane it points to (`from` for a note).
    pub to: usize,
    /// What it says.
    pub label: String,
    /// What it is.
    pub kind: Kind,
}

/// Participants and events, in order.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    lanes: Vec<String>,
    events: Vec<Event>,
}

const LANE_WIDTH: usize = 210;
const MARGIN: usize = 20;
const HEADER: usize = 64;
const ROW: usize = 30;

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lane called `name`, added at the right if new.
    pub fn lane(&mut self, name: &str) -> usize {
        if let Some(i) = self.lanes.iter().position(|l| l == name) {
            return i;
        }
        self.lanes.push(name.to_string());
        self.lanes.len() - 1
    }

    /// An arrow from lane `from` to lane `to`.
    pub fn arrow(&mut self, from: &str, to: &str, label: impl Into<String>, kind: Kind) {
        let (from, to) = (self.lane(from), self.lane(to));
        self.events.push(Event {
            from,
            to,
            label: label.into(),
            kind,
        });
    }

    /// A note on lane `lane`.
    pub fn note(&mut self, lane: &str, label: impl Into<String>) {
        let lane = self.lane(lane);
        self.events.push(Event {
            from: lane,
            to: lane,
            label: label.into(),
            kind: Kind::Note,
        });
    }

    /// The events so far.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The diagram as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let width = 2 * MARGIN + self.lanes.len().max(1) * LANE_WIDTH;
        let height = HEADER + (self.events.len() + 1) * ROW + MARGIN;
        let x = |lane: usize| MARGIN + lane * LANE_WIDTH + LANE_WIDTH / 2;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r##"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">
<title>mini-broker: fencing a zombie producer</title>
<defs>
  <marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker>
</defs>
<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>"##
        );
        for (i, lane) in self.lanes.iter().enumerate() {
            let cx = x(i);
            let _ = writeln!(
                svg,
                r##"<g class="lane"><rect x="{}" y="{MARGIN}" width="{}" height="28" rx="5" fill="#eef2f7" stroke="#445"/><text x="{cx}" y="{}" text-anchor="middle" font-weight="bold">{}</text><line x1="{cx}" y1="{}" x2="{cx}" y2="{}" stroke="#99a" stroke-dasharray="4 4"/></g>"##,
                cx - LANE_WIDTH / 2 + 10,
                LANE_WIDTH - 20,
                MARGIN + 19,
                escape(lane),
                MARGIN + 28,
                height - MARGIN
            );
        }
        for (row, e) in self.events.iter().enumerate() {
            let y = HEADER + (row + 1) * ROW;
            let (colour, dash, weight) = match e.kind {
                Kind::Request => ("#222", "", 1.2),
                Kind::Reply => ("#777", "", 1.0),
                Kind::Rejected => ("#c0392b", "", 1.6),
                Kind::Marker => ("#7d3c98", "6 3", 1.2),
                Kind::Fence => ("#e67e22", "6 3", 2.4),
                Kind::Note => ("#555", "", 1.0),
            };
            let class = match e.kind {
                Kind::Request => "request",
                Kind::Reply => "reply",
                Kind::Rejected => "rejected",
                Kind::Marker => "marker",
                Kind::Fence => "fence",
                Kind::Note => "note",
            };
            if e.kind == Kind::Note {
                let cx = x(e.from);
                let w = (e.label.chars().count() * 7 + 16).min(2 * LANE_WIDTH - 20);
                let _ = writeln!(
                    svg,
                    r##"<g class="{class}"><rect x="{}" y="{}" width="{w}" height="22" rx="4" fill="#fff8dc" stroke="#b8a040"/><text x="{cx}" y="{}" text-anchor="middle">{}</text></g>"##,
                    cx.saturating_sub(w / 2),
                    y - 15,
                    y,
                    escape(&e.label)
                );
                continue;
            }
            let (x1, x2) = (x(e.from), x(e.to));
            let label_x = (x1 + x2) / 2;
            let dash = if dash.is_empty() {
                String::new()
            } else {
                format!(r#" stroke-dasharray="{dash}""#)
            };
            let _ = writeln!(
                svg,
                r##"<g class="{class}"><line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{colour}" stroke-width="{weight}"{dash} marker-end="url(#head)"/><text x="{label_x}" y="{}" text-anchor="middle" fill="{colour}">{}</text></g>"##,
                y - 5,
                escape(&e.label)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// Escapes text for an SVG text node or attribute.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_added_once_in_order() {
        let mut t = Timeline::new();
        t.arrow("A", "coordinator 1", "InitProducerId", Kind::Request);
        t.arrow("coordinator 1", "A", "PID 1000, epoch 0", Kind::Reply);
        t.note("A", "GC pause");
        assert_eq!(t.lanes, vec!["A", "coordinator 1"]);
        assert_eq!(t.events().len(), 3);
        assert_eq!((t.events()[1].from, t.events()[1].to), (1, 0));
    }

    #[test]
    fn text_is_escaped() {
        let mut t = Timeline::new();
        t.note("A & B", "epoch <3> \"fenced\"");
        let svg = t.to_svg();
        assert!(svg.contains("A &amp; B"));
        assert!(svg.contains("epoch &lt;3&gt; &quot;fenced&quot;"));
        assert!(!svg.contains("<3>"));
    }
}
