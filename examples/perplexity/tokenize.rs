//! The model's byte-level BPE tokenizer, built from the GGUF's token list and merges with the
//! `tokenizers` crate: digits split one by one, then GPT-2's byte-level pre-tokenizer (as
//! SmolLM2's own tokenizer does), control tokens kept whole.

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

/// Token type of control tokens (`<|im_start|>`, …) in a GGUF.
const CONTROL: i32 = 3;

/// Builds the tokenizer of a GGUF's vocabulary: token strings and types by id, BPE merges in
/// rank order.
pub fn tokenizer(
    tokens: &[String],
    types: &[i32],
    merges: &[(String, String)],
) -> Result<Tokenizer, String> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges.to_vec())
        .build()
        .map_err(|e| format!("BPE: {e}"))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Digits(Digits::new(true)),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
    ])));
    tok.with_decoder(Some(ByteLevel::default()));
    let control: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, ty)| **ty == CONTROL)
        .map(|(t, _)| AddedToken::from(t.clone(), true))
        .collect();
    tok.add_special_tokens(&control);
    Ok(tok)
}

/// The ids of `text` (no BOS: the model's GGUF sets `add_bos_token = false`).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    Ok(tok
        .encode(text, false)
        .map_err(|e| format!("tokenize: {e}"))?
        .get_ids()
        .to_vec())
}
