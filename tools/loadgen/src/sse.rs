//! Incremental Server-Sent-Events decoder for OpenAI-style streams.
//!
//! Bytes arrive in arbitrary pieces (a chunk boundary may split a line or even a UTF-8
//! character), so the decoder buffers until it sees a full line and emits one [`SseEvent`]
//! per blank-line-terminated event. Only `data:` fields matter for OpenAI streams;
//! comments (`:`) and other fields are ignored.

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The `data:` payload (multi-line data joined with `\n`).
    Data(String),
    /// The `data: [DONE]` sentinel that ends an OpenAI stream.
    Done,
}

/// Buffers raw bytes and yields complete events.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; returns every event completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line(&line, &mut events);
        }
        events
    }

    /// Flushes an event left without its terminating blank line when the stream ends.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            self.line(&line, &mut events);
        }
        self.dispatch(&mut events);
        events
    }

    fn line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(events);
            return;
        }
        let text = String::from_utf8_lossy(line);
        let Some(value) = text.strip_prefix("data:") else {
            return; // comment or a field OpenAI streams do not use
        };
        let value = value.strip_prefix(' ').unwrap_or(value);
        match &mut self.data {
            Some(d) => {
                d.push('\n');
                d.push_str(value);
            }
            None => self.data = Some(value.to_owned()),
        }
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        if let Some(data) = self.data.take() {
            if data.trim() == "[DONE]" {
                events.push(SseEvent::Done);
            } else {
                events.push(SseEvent::Data(data));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_arbitrary_byte_boundaries_decode_identically() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        let whole = SseDecoder::new().push(stream);
        for cut in 1..stream.len() {
            let mut d = SseDecoder::new();
            let mut got = d.push(&stream[..cut]);
            got.extend(d.push(&stream[cut..]));
            assert_eq!(got, whole, "cut at {cut}");
        }
        assert_eq!(
            whole,
            vec![
                SseEvent::Data("{\"a\":1}".into()),
                SseEvent::Data("{\"b\":2}".into()),
                SseEvent::Done
            ]
        );
    }

    #[test]
    fn an_unterminated_final_event_is_flushed_at_end_of_stream() {
        let mut d = SseDecoder::new();
        assert!(d.push(b"data: {\"x\":1}").is_empty());
        assert_eq!(d.finish(), vec![SseEvent::Data("{\"x\":1}".into())]);
    }
}
