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
        // Wide enough for the longest lane name (bold, ~8 px a character at 12 px).
        let lane_width = self
            .lanes
            .iter()
            .map(|l| l.chars().count() * 8 + 30)
            .max()
            .unwrap_or(0)
            .max(LANE_WIDTH);
        let width = 2 * MARGIN + self.lanes.len().max(1) * lane_width;
        let height = HEADER + (self.events.len() + 1) * ROW + MARGIN;
        let x = |lane: usize| MARGIN + lane * lane_width + lane_width / 2;
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
                cx - lane_width / 2 + 10,
                lane_width - 20,
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
                // Centred on its lane, kept inside the picture.
                let w = e.label.chars().count() * 7 + 16;
                let left = x(e.from)
                    .saturating_sub(w / 2)
                    .clamp(2, width.saturating_sub(w + 2).max(2));
                let _ = writeln!(
                    svg,
                    r##"<g class="{class}"><rect x="{left}" y="{}" width="{w}" height="22" rx="4" fill="#fff8dc" stroke="#b8a040"/><text x="{}" y="{}" text-anchor="middle">{}</text></g>"##,
                    y - 15,
                    left + w / 2,
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

/// One epoch change as `transactions history` reports it (DescribeTransactions' history).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// The PID after the change.
    pub producer_id: i64,
    /// The epoch after the change.
    pub epoch: i32,
    /// Why (`new_producer_id`, `new_instance`, `kip360`, `end_txn`, `timeout`, `rotation`).
    pub cause: String,
    /// Who asked (a client address, or `coordinator`).
    pub instance: String,
}

/// The epoch history of a transactional id as a timeline: one lane per instance (client
/// address) in order of appearance, and the coordinator; a new instance's InitProducerId is
/// drawn as the fence of the one before it, runs of commits by one instance as one arrow.
/// This is the picture `transactions history ID --svg FILE` draws, e.g. at the end of the
/// compose demo (where no in-process story exists to record requests one by one).
pub fn history_timeline(coordinator: &str, changes: &[HistoryEntry]) -> Timeline {
    let mut t = Timeline::new();
    let mut names: Vec<String> = Vec::new();
    let mut lane_of = |t: &mut Timeline, instance: &str| -> String {
        if instance == "coordinator" {
            return coordinator.to_string();
        }
        let position = match names.iter().position(|n| n == instance) {
            Some(i) => i,
            None => {
                names.push(instance.to_string());
                names.len() - 1
            }
        };
        let name = format!("instance {} ({instance})", position + 1);
        t.lane(&name);
        name
    };
    t.lane(coordinator);
    let mut previous: Option<String> = None;
    let mut i = 0;
    while i < changes.len() {
        let c = &changes[i];
        let lane = lane_of(&mut t, &c.instance);
        match c.cause.as_str() {
            "end_txn" => {
                // A run of commits/aborts by the same instance: one arrow.
                let mut j = i;
                while j + 1 < changes.len()
                    && changes[j + 1].cause == "end_txn"
                    && changes[j + 1].instance == c.instance
                {
                    j += 1;
                }
                let label = if j == i {
                    format!("EndTxn -> epoch {}", c.epoch)
                } else {
                    format!(
                        "EndTxn x{} -> epochs {}..{}",
                        j - i + 1,
                        c.epoch,
                        changes[j].epoch
                    )
                };
                t.arrow(&lane, coordinator, label, Kind::Request);
                i = j;
            }
            "new_instance" => {
                let fenced = previous.as_ref().filter(|p| **p != lane).cloned();
                t.arrow(&lane, coordinator, "InitProducerId", Kind::Request);
                match fenced {
                    Some(old) => t.arrow(
                        coordinator,
                        &old,
                        format!("fenced at epoch {}", c.epoch),
                        Kind::Fence,
                    ),
                    None => t.note(
                        coordinator,
                        format!("bumped again once the abort completed: epoch {}", c.epoch),
                    ),
                }
                t.arrow(
                    coordinator,
                    &lane,
                    format!("PID {}, epoch {}", c.producer_id, c.epoch),
                    Kind::Reply,
                );
            }
            "new_producer_id" => {
                t.arrow(&lane, coordinator, "InitProducerId (new id)", Kind::Request);
                t.arrow(
                    coordinator,
                    &lane,
                    format!("PID {}, epoch {}", c.producer_id, c.epoch),
                    Kind::Reply,
                );
            }
            "kip360" => {
                t.arrow(
                    &lane,
                    coordinator,
                    format!("InitProducerId(expected) -> epoch {} (KIP-360)", c.epoch),
                    Kind::Request,
                );
            }
            "timeout" => t.note(
                coordinator,
                format!("timed out: aborted, epoch {}", c.epoch),
            ),
            other => t.note(
                coordinator,
                format!("{other}: PID {}, epoch {}", c.producer_id, c.epoch),
            ),
        }
        if c.instance != "coordinator" {
            previous = Some(lane);
        }
        i += 1;
    }
    t
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
    fn a_history_draws_the_fence_of_the_older_instance() {
        let entry = |epoch, cause: &str, instance: &str| HistoryEntry {
            producer_id: 1,
            epoch,
            cause: cause.into(),
            instance: instance.into(),
        };
        let t = history_timeline(
            "coordinator 2",
            &[
                entry(0, "new_producer_id", "10.0.0.5:4000"),
                entry(1, "end_txn", "10.0.0.5:4000"),
                entry(2, "end_txn", "10.0.0.5:4000"),
                entry(3, "new_instance", "10.0.0.6:5000"),
                entry(4, "new_instance", "10.0.0.6:5000"),
                entry(5, "end_txn", "10.0.0.6:5000"),
                entry(6, "timeout", "coordinator"),
            ],
        );
        assert_eq!(
            t.lanes,
            vec![
                "coordinator 2",
                "instance 1 (10.0.0.5:4000)",
                "instance 2 (10.0.0.6:5000)"
            ]
        );
        let fences: Vec<&Event> = t
            .events()
            .iter()
            .filter(|e| e.kind == Kind::Fence)
            .collect();
        assert_eq!(fences.len(), 1, "{:?}", t.events());
        assert_eq!((fences[0].from, fences[0].to), (0, 1));
        assert!(t
            .events()
            .iter()
            .any(|e| e.label == "EndTxn x2 -> epochs 1..2"));
        assert!(t.to_svg().contains("timed out: aborted, epoch 6"));
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
