// The encode corpus: strings chosen to break byte-level BPE tokenizers, and
// random mixtures of them (seeded, so every run makes the same corpus).
"use strict";

function rng(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const spaces = [" ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
  "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f",
  "\u205f", "\u3000", "\u200b", "\u200c", "\u200d", "\ufeff", "\u001c", "\u001d", "\u001e", "\u001f", "\u0000"];

const words = [
  // Latin, contractions, casing
  "hello", "Hello", "HELLO", "world", "I'm", "I'M", "you're", "YOU'RE", "we've", "they'll", "he'd", "it's", "IT'S",
  "don't", "DON'T", "can't", "y'all", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "’s", "it’s", "o'clock",
  "rock'n'roll", "'''", "''", "'", "'x", "ſ", "'ſ", "K", "'K", "'İ", "straße", "STRASSE", "naïve", "café", "Ångström",
  "œuvre", "Æsir", "ĳ", "ﬁ", "ﬀ", "Ǆ", "ǅ", "ǆ",
  // digits and numbers
  "0", "1", "12", "123", "1234", "12345", "123456", "1234567", "3.14159", "1,000,000", "1e10", "0x1F", "-42", "+7",
  "٠١٢٣٤٥٦٧٨٩", "۱۲۳", "१२३४", "১২৩", "１２３４", "²³", "¼½¾", "Ⅻ", "ⅷ", "①②③", "𝟙𝟚𝟛", "〇", "二〇二四", "𐒠𐒡",
  // scripts
  "日本語のテキスト", "カタカナ", "ｶﾀｶﾅ", "中文文本测试", "繁體中文", "한국어 텍스트", "한국어", "العربية", "مرحبا بالعالم",
  "עברית", "שלום", "हिन्दी", "नमस्ते", "ภาษาไทย", "สวัสดี", "Русский", "привет", "Ελληνικά", "ქართული", "Հայերեն",
  "አማርኛ", "தமிழ்", "বাংলা", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "සිංහල", "ລາວ", "ខ្មែរ", "မြန်မာ", "བོད་ཡིག", "ᠮᠣᠩᠭᠣᠯ",
  "Tiếng Việt", "Türkçe", "İstanbul", "ıi", "Ελλάδα", "ꦗꦮ", "𓀀𓀁", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐁𝐨𝐥𝐝", "ℌℑℜ", "Ωmega",
  // emoji
  "😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵🇫🇷", "1️⃣", "#️⃣", "❤️", "❤", "🫠", "🧑🏿‍🚀", "👩‍❤️‍💋‍👨",
  "✋🏻✋🏼✋🏽", "🤷‍♀️", "🐈‍⬛", "☺️", "⌚", "🀄", "🂡",
  // combining marks, normalisation
  "e\u0301", "é", "A\u030a", "Å", "\u212b", "n\u0303", "Z\u0351\u0355\u0347a\u0362l\u035cg\u0339o\u0353", "o\u0308\u0304",
  "\u1100\u1161\u11a8", "각", "\u0915\u093c", "\u0958", "\u00c5\u0327", "\u0041\u0327\u030a", "\ufb01", "\u2126", "\u03a9",
  "\u0301", "\u0301\u0301", "a\u200db", "a\u200cb", "\u00ad", "soft\u00adhyphen", "\u2060", "\u180e",
  // special-token text
  "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
  "<|reserved_special_token_0|>", "<|reserved_special_token_250|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
  "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "<|fim_prefix|>", "<|vision_pad|>",
  "<|im_start", "im_end|>", "<|eot_id", "<|", "|>", "<||>", "<|begin_of_text|><|begin_of_text|>", "<s>", "</s>", "<unk>",
  "< |eot_id|>", "<|EOT_ID|>", "<|im_start|>user\nhi<|im_end|>",
  // code, markup, punctuation
  "func main() {\n\tfmt.Println(\"hi\")\n}", "def f(x):\n    return x**2\n", "if (a && b || !c) { return; }",
  "<div class=\"x\">&amp;&nbsp;</div>", "SELECT * FROM t WHERE id = 1;", "{\"key\": [1, 2.5, null, true]}",
  "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Windows\\System32", "$HOME/.config",
  "...", "…", "—", "–", "!!!", "???", "?!", "((()))", "[[]]", "{{}}", "```", "---", "***", "###", "|||", "~~~",
  "«»", "„“", "「」", "【】", "¿¡", "§¶", "©®™", "°±×÷", "€£¥₹₿", "→←↑↓", "∀∃∈∉∑∏√∞", "≤≥≠≈", "♠♣♥♦",
  "\\n", "\\t", "\\\\", "%s%d", "@#$%^&*", "a.b.c", "a_b_c", "a-b-c", "camelCaseWord", "snake_case_word",
];

const chars = [];
for (const w of words) for (const c of w) chars.push(c);

function pick(r, a) {
  return a[Math.floor(r() * a.length)];
}

function corpus() {
  const out = [];
  const seen = new Set();
  const add = (s) => {
    if (!seen.has(s)) {
      seen.add(s);
      out.push(s);
    }
  };
  add("");
  for (const w of words) {
    add(w);
    add(" " + w);
    add(w + " ");
    add("  " + w);
    add("\n" + w);
    add(w + "\n\n");
    add(w + w);
    add("a" + w + "b");
  }
  for (const s of spaces) {
    add(s);
    for (const n of [2, 3, 7, 16]) add(s.repeat(n));
    add("a" + s + "b");
    add("a" + s + s + "b");
    add(s + "a");
    add("a" + s);
    add("1" + s + "2");
    add("." + s + ".");
  }
  for (const a of spaces.slice(0, 12)) for (const b of spaces.slice(0, 12)) add("x" + a + b + "y" + b + a);
  // Digit runs of every length up to 40, and mixed with letters.
  for (let n = 1; n <= 40; n++) {
    add("7".repeat(n));
    add("x" + "1234567890".repeat(5).slice(0, n) + "y");
    add(" " + "9".repeat(n));
  }
  // Very long runs: each kind at a few lengths, up to 60,000 characters.
  const runs = ["a", " ", "\n", "\t", "1", "ab", "a ", "\r\n", "😀", "日", "é", "e\u0301", "'s", "<|eot_id|>", "!",
    " \n", "x\u200d", "٣"];
  for (const u of runs) {
    for (const n of [50, 255, 256, 257, 1000]) add(u.repeat(n));
  }
  for (const u of ["a", " ", "1", "😀", "ab ", "\n\n "]) add(u.repeat(Math.ceil(60000 / u.length)).slice(0, 60000));
  // Sentences.
  const r = rng(20260412);
  for (let i = 0; i < 1200; i++) {
    const n = 1 + Math.floor(r() * 12);
    let s = "";
    for (let j = 0; j < n; j++) {
      s += pick(r, words);
      s += r() < 0.8 ? " " : pick(r, spaces);
    }
    if (r() < 0.5) s = s.trimEnd();
    add(s);
  }
  // Character soup.
  for (let i = 0; i < 1200; i++) {
    const n = 1 + Math.floor(r() * 40);
    let s = "";
    for (let j = 0; j < n; j++) s += r() < 0.2 ? pick(r, spaces) : pick(r, chars);
    add(s);
  }
  // Random code points from assigned ranges of several planes.
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff],
    [0x900, 0x97f], [0xe00, 0xe5b], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2190, 0x23ff], [0x3040, 0x30ff],
    [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xff00, 0xffef], [0x1f300, 0x1f5ff], [0x1f900, 0x1f9ff], [0x1d400, 0x1d7ff]];
  for (let i = 0; i < 600; i++) {
    const n = 1 + Math.floor(r() * 30);
    let s = "";
    for (let j = 0; j < n; j++) {
      const [lo, hi] = pick(r, ranges);
      s += String.fromCodePoint(lo + Math.floor(r() * (hi - lo + 1)));
    }
    add(s);
  }
  return out;
}

module.exports = { corpus };
