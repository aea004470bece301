"""Viterbi (most probable) parses of a PCFG in Chomsky normal form, by CKY with numpy: the
PCFG baseline's parser. nltk's ViterbiParser does the same in pure Python and, with the
~4,500 rules read off the sample's training trees, runs past its 5-second limit on a 5-word
sentence; here every split of a span is one vector operation over all binary rules."""
import numpy as np
import nltk


class ViterbiCKY:
  """A parser of `grammar`: binary rules A -> B C, lexical rules A -> 'terminal', and unary
  rules from the start symbol only (ROOT -> A), as nltk's chomsky_normal_form plus
  collapse_unary leave a treebank grammar."""

  def __init__(self, grammar: nltk.PCFG):
    self.start = grammar.start()
    symbols = sorted({p.lhs() for p in grammar.productions()} |
                     {s for p in grammar.productions() for s in p.rhs()
                      if isinstance(s, nltk.Nonterminal)}, key=str)
    self.symbols = symbols
    index = {s: i for i, s in enumerate(symbols)}
    binary = [p for p in grammar.productions() if len(p.rhs()) == 2]
    self.lhs = np.array([index[p.lhs()] for p in binary])
    self.left = np.array([index[p.rhs()[0]] for p in binary])
    self.right = np.array([index[p.rhs()[1]] for p in binary])
    self.logp = np.log([p.prob() for p in binary])
    self.lexical: dict[str, list[tuple[int, float]]] = {}
    self.roots: list[tuple[int, float]] = []
    for p in grammar.productions():
      if len(p.rhs()) == 1 and isinstance(p.rhs()[0], str):
        self.lexical.setdefault(p.rhs()[0], []).append((index[p.lhs()], np.log(p.prob())))
      elif len(p.rhs()) == 1 and p.lhs() == self.start:
        self.roots.append((index[p.rhs()[0]], np.log(p.prob())))
      elif len(p.rhs()) == 1:
        raise ValueError(f"a unary rule below the start symbol: {p}")

  def parse(self, terminals: list[str]) -> nltk.Tree | None:
    """The most probable tree over the terminals (without the start symbol), or None."""
    return self.parse_scored(terminals)[0]

  def parse_scored(self, terminals: list[str]) -> tuple[nltk.Tree | None, float]:
    """(the most probable tree or None, its natural log-probability under the grammar, the
    start symbol's rule included; -inf without a parse)."""
    n, count = len(terminals), len(self.symbols)
    best = np.full((n, n + 1, count), -np.inf)
    back: dict[tuple[int, int, int], tuple[int, int]] = {}  # (i, j, A) -> (rule, split)
    for i, terminal in enumerate(terminals):
      for symbol, logp in self.lexical.get(terminal, []):
        best[i, i + 1, symbol] = max(best[i, i + 1, symbol], logp)
    for width in range(2, n + 1):
      for i in range(n - width + 1):
        j = i + width
        splits = np.arange(i + 1, j)
        # scores[k, r]: rule r over the split at splits[k]
        scores = (self.logp[None, :] + best[i, splits][:, self.left]
                  + best[splits, j][:, self.right])
        split_of_rule = scores.argmax(axis=0)
        rule_scores = scores[split_of_rule, np.arange(len(self.lhs))]
        finite = np.flatnonzero(np.isfinite(rule_scores))
        if not len(finite):
          continue
        # Per left-hand side, its best rule: sort by (lhs, -score) and keep each lhs's first.
        order = finite[np.lexsort((-rule_scores[finite], self.lhs[finite]))]
        first = np.ones(len(order), bool)
        first[1:] = self.lhs[order][1:] != self.lhs[order][:-1]
        for rule in order[first]:
          best[i, j, self.lhs[rule]] = rule_scores[rule]
          back[(i, j, self.lhs[rule])] = (rule, splits[split_of_rule[rule]])
    root_scores = [(best[0, n, symbol] + logp, symbol) for symbol, logp in self.roots]
    score, symbol = max(root_scores, default=(-np.inf, None))
    if not np.isfinite(score):
      return None, -np.inf
    return self._tree(back, terminals, 0, n, symbol), float(score)

  def _tree(self, back, terminals, i, j, symbol) -> nltk.Tree:
    label = self.symbols[symbol].symbol()
    if j == i + 1 and (i, j, symbol) not in back:
      return nltk.Tree(label, [terminals[i]])
    rule, split = back[(i, j, symbol)]
    return nltk.Tree(label, [self._tree(back, terminals, i, split, self.left[rule]),
                             self._tree(back, terminals, split, j, self.right[rule])])
