//! The conversation: the instruct model's chat template (ChatML: `<|im_start|>role\n…<|im_end|>`),
//! each turn one prompt chunk appended to the cache, the reply streamed token by token, then
//! the turn's figures: prompt tokens/s, decode tokens/s, the cache's memory.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use tokenizers::Tokenizer;

use crate::engine::Engine;
use crate::error::{ChatError, Result};
use crate::llama::Vocab;

/// The system message SmolLM2's template puts first when the conversation has none.
pub const DEFAULT_SYSTEM: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// A conversation over one engine (batch 1).
pub struct Chat<'a> {
    engine: &'a mut Engine,
    tok: &'a Tokenizer,
    stop: Vec<u32>,
    im_end: Option<u32>,
    system: String,
    /// The last sampled token, not yet in the cache (it is the next turn's first).
    pending: Option<u32>,
    /// Most tokens per reply.
    pub max_tokens: u32,
}

/// What one turn did.
pub struct Turn {
    /// The reply's token ids (the stop token left out).
    pub ids: Vec<u32>,
    /// Tokens of the turn's prompt chunk.
    pub prompt_tokens: u32,
    /// Seconds of the prompt chunk (its first sampled token included).
    pub prompt_s: f64,
    /// Seconds of the decode steps.
    pub decode_s: f64,
}

impl<'a> Chat<'a> {
    /// A conversation with `system` as its system message.
    pub fn new(engine: &'a mut Engine, tok: &'a Tokenizer, vocab: &Vocab, system: &str) -> Self {
        let im_end = vocab.tokens.iter().position(|t| t == "<|im_end|>");
        Chat {
            engine,
            tok,
            stop: vocab.stop.clone(),
            im_end: im_end.map(|i| i as u32),
            system: system.to_string(),
            pending: None,
            max_tokens: 256,
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tok
            .encode(text, false)
            .map_err(|e| ChatError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }

    /// The ids of a user turn in ChatML, after whatever the conversation holds.
    pub fn turn_ids(&self, user: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut text = String::new();
        match self.pending {
            None => text.push_str(&format!("<|im_start|>system\n{}<|im_end|>\n", self.system)),
            Some(p) => {
                // The last reply's final token, and its end where it was cut short.
                ids.push(p);
                if Some(p) != self.im_end {
                    text.push_str("<|im_end|>");
                }
                text.push('\n');
            }
        }
        text.push_str(&format!(
            "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ));
        ids.extend(self.encode(&text)?);
        Ok(ids)
    }

    /// Sends `user`, streams the reply to `out` as it is sampled.
    pub fn say(&mut self, user: &str, out: &mut dyn Write) -> Result<Turn> {
        let ids = self.turn_ids(user)?;
        let t0 = Instant::now();
        let mut next = self.engine.prompt(std::slice::from_ref(&ids))?[0];
        let prompt_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut reply: Vec<u32> = Vec::new();
        let mut shown = 0;
        while !self.stop.contains(&next) && (reply.len() as u32) < self.max_tokens {
            reply.push(next);
            let text = self
                .tok
                .decode(&reply, true)
                .map_err(|e| ChatError::Tokenizer(e.to_string()))?;
            // Print whole characters only (a token may end inside one).
            if !text.ends_with('\u{fffd}') && text.len() > shown {
                let _ = write!(out, "{}", &text[shown..]);
                let _ = out.flush();
                shown = text.len();
            }
            if self.engine.len() >= self.engine.opts.capacity {
                break;
            }
            next = self.engine.step()?[0];
        }
        self.pending = Some(next);
        let decode_s = t1.elapsed().as_secs_f64();
        let text = self
            .tok
            .decode(&reply, true)
            .map_err(|e| ChatError::Tokenizer(e.to_string()))?;
        if text.len() > shown {
            let _ = write!(out, "{}", &text[shown..]);
        }
        let _ = writeln!(out);
        Ok(Turn {
            ids: reply,
            prompt_tokens: ids.len() as u32,
            prompt_s,
            decode_s,
        })
    }

    /// One line of figures for a turn.
    pub fn figures(&self, t: &Turn) -> String {
        // Every reply token but none was fed through a decode step (the first came from the
        // prompt, and each step fed one and sampled the next).
        let steps = t.ids.len() as f64;
        format!(
            "[prompt {} tokens, {:.1} tok/s; reply {} tokens, {:.1} tok/s; context {} / {}; {} dispatches a step ({} kvq); cache {}]",
            t.prompt_tokens,
            t.prompt_tokens as f64 / t.prompt_s,
            t.ids.len(),
            if t.decode_s > 0.0 {
                steps / t.decode_s
            } else {
                0.0
            },
            self.engine.len(),
            self.engine.opts.capacity,
            self.engine.last_dispatches.own + self.engine.last_dispatches.kvq,
            self.engine.last_dispatches.kvq,
            self.engine.cache.memory(),
        )
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) -> Result<()> {
        self.pending = None;
        self.engine.reset()
    }
}

/// Runs the conversation: `prompts` one turn each, or, with none, lines from stdin (a prompt
/// `> ` on a terminal; `/reset` forgets the conversation, an empty line or end of input ends it).
pub fn run(chat: &mut Chat<'_>, prompts: &[String]) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let turn = |chat: &mut Chat<'_>, text: &str, out: &mut dyn Write| -> Result<()> {
        let t = chat.say(text, out)?;
        eprintln!("{}", chat.figures(&t));
        Ok(())
    };
    if !prompts.is_empty() {
        for p in prompts {
            turn(chat, p, &mut out)?;
        }
        return Ok(());
    }
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    loop {
        if tty {
            let _ = write!(out, "> ");
            let _ = out.flush();
        }
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| ChatError::Io {
                path: "stdin".into(),
                source: e,
            })?
            == 0
        {
            return Ok(());
        }
        let line = line.trim();
        match line {
            "" => return Ok(()),
            "/reset" => chat.reset()?,
            _ => turn(chat, line, &mut out)?,
        }
    }
}
