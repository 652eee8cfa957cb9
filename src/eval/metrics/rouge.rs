//! `response_match_score`: ROUGE-1's F-measure of the final response against the expected
//! one, as ADK 2.13's `RougeEvaluator` computes it: its Unicode-aware tokenizer (NFKC,
//! lower case, CJK split per character) in front of `rouge_score`'s default tokenizer with
//! NLTK's Porter stemmer (words over three letters), unigram counts clipped to the smaller.

use nltk_porter::{Mode, PorterStemmer};
use std::collections::HashMap;
use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// Words longer than this are not stemmed. The stemmer's cost grows with the square of a
/// word's length (a run of `y`s), and a model's answer may hold one word of megabytes; no
/// English word comes near it, so a score differs from ADK's only for such a word.
const MAX_STEMMED_CHARS: usize = 64;

/// ROUGE-1 of `candidate` against `reference`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rouge1 {
    pub precision: f64,
    pub recall: f64,
    pub fmeasure: f64,
}

pub fn rouge1(candidate: &str, reference: &str) -> Rouge1 {
    let stemmer = PorterStemmer::new(Mode::Nltk);
    let counts = |text: &str| {
        let mut m: HashMap<String, usize> = HashMap::new();
        for t in tokenize(text, &stemmer) {
            *m.entry(t).or_default() += 1;
        }
        m
    };
    let (pred, target) = (counts(candidate), counts(reference));
    let overlap: usize = target
        .iter()
        .map(|(t, n)| (*n).min(pred.get(t).copied().unwrap_or(0)))
        .sum();
    let pred_n: usize = pred.values().sum();
    let target_n: usize = target.values().sum();
    let precision = overlap as f64 / pred_n.max(1) as f64;
    let recall = overlap as f64 / target_n.max(1) as f64;
    let fmeasure = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    Rouge1 {
        precision,
        recall,
        fmeasure,
    }
}

/// CJK ideographs, kana and Hangul: one token per character.
fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3040..=0x309F | 0x30A0..=0x30FF | 0xAC00..=0xD7AF)
}

/// Thai, Lao, Khmer, Myanmar: one token per base character and its marks.
fn is_non_spaced(c: char) -> bool {
    matches!(c as u32, 0x0E00..=0x0E7F | 0x0E80..=0x0EFF | 0x1780..=0x17FF | 0x1000..=0x109F)
}

fn is_mark(c: char) -> bool {
    c.general_category_group() == GeneralCategoryGroup::Mark
}

/// Python's `str.isalnum()` (a letter or a number) or a combining mark.
fn is_word_char(c: char) -> bool {
    matches!(
        c.general_category_group(),
        GeneralCategoryGroup::Letter | GeneralCategoryGroup::Number | GeneralCategoryGroup::Mark
    )
}

fn tokenize(text: &str, stemmer: &PorterStemmer) -> Vec<String> {
    // Python's `str.lower()` after NFKC.
    let text: String = text.nfkc().collect::<String>().to_lowercase();
    let mut spaced = String::with_capacity(text.len());
    for c in text.chars() {
        if is_cjk(c) {
            spaced.push(' ');
            spaced.push(c);
            spaced.push(' ');
        } else if is_non_spaced(c) {
            if !is_mark(c) {
                spaced.push(' ');
            }
            spaced.push(c);
        } else if is_word_char(c) {
            spaced.push(c);
        } else {
            spaced.push(' ');
        }
    }
    let mut tokens = vec![];
    for word in spaced.split_whitespace() {
        if word.is_ascii() {
            tokens.extend(default_tokens(word, stemmer));
        } else {
            tokens.push(word.to_string());
        }
    }
    tokens
}

/// `rouge_score`'s tokenizer: lower case, runs of anything but `[a-z0-9]` are spaces, words
/// over three characters stemmed, only `[a-z0-9]+` tokens kept.
fn default_tokens(text: &str, stemmer: &PorterStemmer) -> Vec<String> {
    let lower = text.to_lowercase();
    let cleaned: String = lower
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                ' '
            }
        })
        .collect();
    cleaned
        .split_whitespace()
        .map(|t| {
            let n = t.len(); // ASCII here: bytes are characters
            if n > 3 && n <= MAX_STEMMED_CHARS {
                stemmer.stem(t)
            } else {
                t.to_string()
            }
        })
        .filter(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_words_score_one_and_none_zero() {
        assert_eq!(rouge1("The cat sat.", "the cat sat").fmeasure, 1.0);
        assert_eq!(rouge1("dogs", "cats").fmeasure, 0.0);
        assert_eq!(rouge1("", "").fmeasure, 0.0);
    }

    #[test]
    fn stems_and_counts_clip() {
        // "running" and "runs" both stem to "run"; "the" twice in the candidate counts once.
        let r = rouge1("the the running", "the runs");
        assert_eq!(r.precision, 2.0 / 3.0);
        assert_eq!(r.recall, 1.0);
    }

    #[test]
    fn a_huge_word_costs_no_more_than_its_length() {
        let word = "y".repeat(1 << 20);
        let r = rouge1(&word, &word);
        assert_eq!(r.fmeasure, 1.0);
    }

    #[test]
    fn cjk_is_split_per_character() {
        let r = rouge1("你好世界", "你好");
        assert_eq!(r.recall, 1.0);
        assert_eq!(r.precision, 0.5);
    }
}
