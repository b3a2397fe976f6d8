"""What a pass over a corpus keeps of each feature, in memory that does not grow with the corpus.

Per feature of a dictionary of d_sae features:
- counts: how many tokens it fires on (activation > 0), the sum of its activations, and a histogram of them on a
  log scale (BINS_PER_OCTAVE bins per doubling from 2**LOWEST to 2**HIGHEST; values beyond go to the end bins), from
  which the quantiles are read: each to within a bin, 9% of the value;
- the `top_k` tokens where it is largest (ties to the earliest token of the corpus), each with its context: the
  tokens from `before` to `after` around it and the feature's activation at each;
- a uniform sample of `samples` of the tokens it fires on, with the same context: the examples of the quantile bands.
  A token's place in the sample is decided by a hash of (its place in the corpus, the feature), not by chance, so
  the sample is the same however the corpus is split among processes or runs.

All of it merges: two FeatureStats over disjoint parts of a corpus make, merged, the FeatureStats of the whole (the
sums add, the kept examples are re-chosen by the same order), which is how a resumed run and the ranks of torchrun
combine their parts. Memory, all of it taken when the pass starts so that it cannot grow: d_sae x (BINS x 8 +
(top_k + samples) x (context x 8 + 48)) bytes, and as many entries again (at least PENDING) waiting to be sorted in,
with their windows; 16384 features with the defaults take about 300 MB.

Fast enough to keep up with the forward passes: each batch's firings are counted at once, and those that may enter
the top or the sample (their key passes the feature's threshold as it stands) have their context read while the
batch is there and wait in a buffer, which is sorted into the kept rows before it would hold more than its bound.
"""

import torch

BINS_PER_OCTAVE = 8
LOWEST, HIGHEST = -16, 16  # log2 of the histogram's range
BINS = (HIGHEST - LOWEST) * BINS_PER_OCTAVE + 2  # with the two end bins
_MASK = 0x7FFFFFFF
PENDING = 1 << 16  # entries waiting to be sorted into the kept examples: at least this many, at most as many as kept


def bin_of(values: torch.Tensor) -> torch.Tensor:
    """The histogram bin of each positive value: 0 below 2**LOWEST, BINS - 1 at or above 2**HIGHEST."""
    scaled = torch.floor(torch.log2(values.double()) * BINS_PER_OCTAVE) - LOWEST * BINS_PER_OCTAVE + 1
    return scaled.clamp(0, BINS - 1).long()


def bin_edges() -> torch.Tensor:
    """[BINS + 1] the lower edge of each bin and the upper edge of the last (0 and inf at the ends)."""
    inner = 2.0 ** (torch.arange(BINS - 1, dtype=torch.float64) / BINS_PER_OCTAVE + LOWEST)
    return torch.cat([torch.zeros(1, dtype=torch.float64), inner, torch.full((1,), float("inf"), dtype=torch.float64)])


def _mixed(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (two rounds of multiply and xor-shift), in int64 without overflow."""
    for _ in range(2):
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & _MASK
    return x ^ (x >> 16)


def sample_key(token: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """A pseudo-random key for (token, feature): the sample keeps each feature's smallest keys."""
    return _mixed(_mixed((token & _MASK) ^ (token >> 31)) ^ feature)


def top_key(values: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The order of the top examples as one int64 (larger first): the activation (a positive float32's bits, which
    order as its value), then the earlier token."""
    return (values.float().view(torch.int32).long() << 31) | (_MASK - token.clamp(max=_MASK))


def sample_order(token: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """The order of the sample as one int64 (larger first): the smaller hash of (token, feature), then the earlier
    token. Keeping each feature's largest is a uniform sample of its firings."""
    return ((_MASK - sample_key(token, feature)) << 31) | (_MASK - token.clamp(max=_MASK))


class Windows:
    """The context windows of kept and waiting examples: token ids and activations [width] each, in `capacity` slots
    taken at once (the memory a pass holds is known from its start); the Keeps point to slots. Slots are appended as
    examples wait; `compact` moves those a Keep points to to the front and frees the rest."""

    def __init__(self, width: int, capacity: int):
        self.ids = torch.full((capacity, width), -1, dtype=torch.int32)
        self.acts = torch.zeros(capacity, width)
        self.used = 0

    def add(self, ids: torch.Tensor, acts: torch.Tensor) -> torch.Tensor:
        """Store windows [n, width] each; their slots [n]."""
        count = len(ids)
        if self.used + count > len(self.ids):  # FeatureStats flushes before this: a broken bound, not bad input
            raise RuntimeError(f"context windows over their capacity: {self.used} + {count} > {len(self.ids)}")
        self.ids[self.used:self.used + count], self.acts[self.used:self.used + count] = ids, acts
        self.used += count
        return torch.arange(self.used - count, self.used)

    def at(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows (ids, acts) [*slots.shape, width] at `slots`; an empty slot (-1) gives a blank window (ids
        -1, acts 0)."""
        blank = (slots < 0)[..., None]
        at = slots.clamp(min=0)
        return self.ids[at].masked_fill(blank, -1), self.acts[at].masked_fill(blank, 0.0)

    def load(self, ids: torch.Tensor, acts: torch.Tensor) -> None:
        """Hold the saved windows `ids`, `acts` [n, width] in the first n slots."""
        self.used = 0
        self.add(ids, acts)

    def compact(self, keeps: list["Keep"]) -> None:
        """Keep only the windows `keeps` point to (two may point to one), renumbered in order, in place."""
        live = torch.unique(torch.cat([keep.slot[keep.key >= 0] for keep in keeps]))
        self.ids[:len(live)], self.acts[:len(live)] = self.ids[live], self.acts[live]
        self.used = len(live)
        for keep in keeps:
            filled = keep.key >= 0
            keep.slot[filled] = torch.searchsorted(live, keep.slot[filled])


class Keep:
    """Per feature, the `size` entries of largest key (an int64 that orders them, see top_key), sorted, each with the
    token's activation, document, position and the slot of its context window in `windows`."""

    FIELDS = ("key", "token", "value", "document", "position", "slot")

    def __init__(self, features: int, size: int, windows: Windows):
        self.size, self.windows = size, windows
        self.key = torch.full((features, size), -1, dtype=torch.int64)  # -1: an empty slot
        self.token = torch.full((features, size), -1, dtype=torch.int64)
        self.value = torch.zeros(features, size)
        self.document = torch.full((features, size), -1, dtype=torch.int64)
        self.position = torch.full((features, size), -1, dtype=torch.int64)
        self.slot = torch.full((features, size), -1, dtype=torch.int64)

    def threshold(self) -> torch.Tensor:
        """[features] the key an entry must pass to be kept: the last one kept's (-1 while there is room)."""
        return self.key[:, -1]

    def update(self, features: torch.Tensor, key: torch.Tensor, token: torch.Tensor, payload) -> None:
        """Offer entries (feature, key, token) [n] each, keys distinct within a feature; `payload(chosen)` gives the
        value, document, position and window slot of the offered entries at indices `chosen` (asked only for those
        kept).

        Each row stays sorted: an offered entry's place is the number of kept entries of its feature whose key is
        larger plus the number of offered ones whose key is larger; a kept entry moves down by the offered entries
        above it, and out past `size`."""
        passing = (key > self.threshold()[features]).nonzero().squeeze(1)
        if passing.numel() == 0:
            return
        features, key, token = features[passing], key[passing], token[passing]
        order = torch.argsort(key, descending=True)
        order = order[torch.argsort(features[order], stable=True)]
        features, key, token, passing = features[order], key[order], token[order], passing[order]
        touched, counts = torch.unique_consecutive(features, return_counts=True)
        row = torch.repeat_interleave(torch.arange(len(touched)), counts)  # each offered entry's touched row
        among_offered = torch.arange(len(features)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        above = (self.key[features] > key[:, None]).sum(1)  # kept entries of the feature with larger keys
        place = above + among_offered
        size = self.size
        # a kept entry at slot k moves down by the offered entries that go above it: those with `above` <= k
        pushed = torch.zeros(len(touched), size + 1, dtype=torch.int64)
        pushed.index_put_((row, above), torch.ones_like(above), accumulate=True)
        moved = torch.arange(size) + pushed.cumsum(1)[:, :size]  # [touched, size] each kept slot's new place
        stays = moved < size
        base = torch.arange(len(touched))[:, None] * size
        flat_old, flat_new = (base + torch.arange(size))[stays], (base + moved)[stays]
        taken = place < size
        given = payload(passing[taken])
        offered = {"key": key[taken], "token": token[taken], **given}
        flat_offered = row[taken] * size + place[taken]
        for name in self.FIELDS:
            whole = getattr(self, name)
            flat = whole.index_select(0, touched).flatten()
            result = torch.empty_like(flat)
            result[flat_new] = flat[flat_old]
            result[flat_offered] = offered[name].to(whole.dtype)
            whole.index_copy_(0, touched, result.view(len(touched), size))

    def merge(self, other: "Keep") -> None:
        """Offer every entry `other` holds (their windows copied in)."""
        rows, slots = (other.key >= 0).nonzero(as_tuple=True)

        def payload(chosen):
            at = other.slot[rows[chosen], slots[chosen]]
            return {"value": other.value[rows[chosen], slots[chosen]],
                    "document": other.document[rows[chosen], slots[chosen]],
                    "position": other.position[rows[chosen], slots[chosen]],
                    "slot": self.windows.add(other.windows.ids[at], other.windows.acts[at])}

        self.update(rows, other.key[rows, slots], other.token[rows, slots], payload)

    def window(self, feature: int, index: int) -> tuple[list[int], list[float]]:
        at = int(self.slot[feature, index])
        return self.windows.ids[at].tolist(), self.windows.acts[at].tolist()

    def state(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    def load(self, state: dict) -> None:
        for name, tensor in state.items():
            setattr(self, name, tensor)


class FeatureStats:
    """The counts, histogram, top examples and sample of every feature (see the module's doc)."""

    def __init__(self, features: int, *, top_k: int = 20, samples: int = 20, before: int = 12, after: int = 4):
        self.features, self.before, self.after = features, before, after
        self.tokens = 0
        self.fired = torch.zeros(features, dtype=torch.int64)
        self.total = torch.zeros(features, dtype=torch.float64)
        self.hist = torch.zeros(features, BINS, dtype=torch.int64)
        kept = features * (top_k + samples)
        self.limit = max(PENDING, kept)  # entries waiting at most
        self.windows = Windows(before + 1 + after, kept + self.limit)
        self.top = Keep(features, top_k, self.windows)
        self.sample = Keep(features, samples, self.windows)
        # entries that may enter the top or the sample (their windows stored), in columns taken once: small tensors
        # kept per batch among the large passing ones would pin the heap, and the process would grow with the corpus
        self.pending = {name: torch.empty(self.limit, dtype=dtype) for name, dtype in self.PENDING.items()}
        self.waiting = 0

    PENDING = {"feature": torch.int64, "token": torch.int64, "value": torch.float32, "document": torch.int64,
               "position": torch.int64, "slot": torch.int64, "top": torch.int64, "sample": torch.int64,
               "to_top": torch.bool, "to_sample": torch.bool}

    def add(self, acts: torch.Tensor, batch: "BatchPlaces") -> None:
        """Count the feature activations `acts` [rows, features] (on any device) of one forward batch; `batch` says
        where each row sits in the batch and the corpus."""
        flat = acts.reshape(-1)
        where = flat.nonzero().squeeze(1)
        values = flat[where].float().cpu()
        where = where.cpu()
        rows, features = where // self.features, where % self.features
        self.tokens += acts.shape[0]
        self.fired += torch.bincount(features, minlength=self.features)
        self.total.index_add_(0, features, values.double())
        self.hist.view(-1).index_add_(0, features * BINS + bin_of(values), torch.ones_like(features))
        token = batch.token[rows]
        top, sample = top_key(values, token), sample_order(token, features)
        to_top, to_sample = top > self.top.threshold()[features], sample > self.sample.threshold()[features]
        # a batch early in the corpus may offer more than the buffer holds: in pieces, sorting in before each overflow
        for chosen in (to_top | to_sample).nonzero().squeeze(1).split(self.limit):
            if self.waiting + len(chosen) > self.limit:
                self.flush()
            ids, window = batch.window(acts, rows[chosen], features[chosen], self.before, self.after)
            entries = {"feature": features[chosen], "token": token[chosen], "value": values[chosen],
                       "document": batch.document[rows[chosen]], "position": batch.position[rows[chosen]],
                       "slot": self.windows.add(ids, window), "top": top[chosen], "sample": sample[chosen],
                       "to_top": to_top[chosen], "to_sample": to_sample[chosen]}
            for name, column in self.pending.items():
                column[self.waiting:self.waiting + len(chosen)] = entries[name]
            self.waiting += len(chosen)

    def flush(self) -> None:
        """Sort the waiting entries into the top and the sample; drop the windows no one points to any more."""
        if not self.waiting:
            return
        entries = {name: column[:self.waiting] for name, column in self.pending.items()}
        self.waiting = 0
        for keep, key, offered in ((self.top, entries["top"], entries["to_top"]),
                                   (self.sample, entries["sample"], entries["to_sample"])):
            at = offered.nonzero().squeeze(1)
            keep.update(entries["feature"][at], key[at], entries["token"][at],
                        lambda chosen, at=at: {name: entries[name][at[chosen]]
                                               for name in ("value", "document", "position", "slot")})
        self.windows.compact([self.top, self.sample])

    def merge(self, other: "FeatureStats") -> None:
        self.flush()
        other.flush()
        self.tokens += other.tokens
        self.fired += other.fired
        self.total += other.total
        self.hist += other.hist
        self.top.merge(other.top)
        self.sample.merge(other.sample)
        self.windows.compact([self.top, self.sample])

    def state(self) -> dict:
        self.flush()
        return {"features": self.features, "before": self.before, "after": self.after, "tokens": self.tokens,
                "fired": self.fired, "total": self.total, "hist": self.hist, "top": self.top.state(),
                "sample": self.sample.state(),  # the windows in use, copied: torch.save writes a view's whole storage
                "window_ids": self.windows.ids[:self.windows.used].clone(),
                "window_acts": self.windows.acts[:self.windows.used].clone()}

    @classmethod
    def from_state(cls, state: dict) -> "FeatureStats":
        stats = cls(state["features"], top_k=state["top"]["key"].shape[1], samples=state["sample"]["key"].shape[1],
                    before=state["before"], after=state["after"])
        stats.tokens = state["tokens"]
        stats.fired, stats.total, stats.hist = state["fired"], state["total"], state["hist"]
        stats.top.load(state["top"])
        stats.sample.load(state["sample"])
        stats.windows.load(state["window_ids"], state["window_acts"])
        return stats

    def quantiles(self, q: torch.Tensor) -> torch.Tensor:
        """[features, len(q)] the q-quantiles of each feature's activations where it fires, read from the
        histogram (within a bin, geometrically; NaN for a feature that never fires)."""
        self.flush()
        edges = bin_edges()
        cumulative = self.hist.cumsum(1).double()
        wanted = q.double()[None, :] * self.fired.double()[:, None]  # [f, q] how many below
        found = torch.searchsorted(cumulative, wanted.clamp(min=0.5)).clamp(max=BINS - 1)
        below = torch.where(found > 0, cumulative.gather(1, (found - 1).clamp(min=0)), torch.zeros_like(wanted))
        inside = self.hist.gather(1, found).double()
        share = ((wanted - below) / inside.clamp(min=1)).clamp(0, 1)
        low = edges[found].clamp(min=edges[1] / 2)
        high = edges[found + 1].clamp(max=float(self.top.value.max()) * 2 + 1e-30)
        result = low * (high / low) ** share
        exact_max = self.top.value[:, 0].double()
        result = torch.minimum(result, exact_max[:, None])
        return torch.where(self.fired[:, None] > 0, result, torch.full_like(result, float("nan")))


class BatchPlaces:
    """Where each row of a forward batch's activations sits: `token` [rows] its place in the corpus (a running count
    over the corpus's sequences), `document` and `position` [rows] (its corpus row and index in that document's
    tokens), and, to read context windows, `ids` [b, s] the batch's token ids (-1 past a sequence's end),
    `row_at` [b, s] the row of each place (-1 where none: padding, a dropped special token), `sequence` and `at`
    [rows] each row's place in the batch."""

    def __init__(self, token, document, position, ids, row_at, sequence, at):
        self.token, self.document, self.position = token, document, position
        self.ids, self.row_at, self.sequence, self.at = ids, row_at, sequence, at

    def window(self, acts: torch.Tensor, rows, features, before: int, after: int):
        """The context of entries (row, feature): the token ids [n, before + 1 + after] around each row (-1 outside
        its sequence) and the feature's activation on each (0 outside; NaN where a token has no row, as a dropped
        special token). Read with flat indices (torch.take), the cheapest gather."""
        width = self.ids.shape[1]
        places = self.at[rows][:, None] + torch.arange(-before, after + 1)
        inside = (places >= 0) & (places < width)
        flat_places = self.sequence[rows][:, None] * width + places.clamp(0, width - 1)
        ids = torch.where(inside, torch.take(self.ids, flat_places), -1)
        row = torch.where(inside, torch.take(self.row_at, flat_places), -1)
        read = torch.take(acts, (row.clamp(min=0) * acts.shape[1] + features[:, None]).to(acts.device)).float().cpu()
        return ids, torch.where(row >= 0, read, torch.where(ids >= 0, float("nan"), 0.0))
