"""`MicroBatcher`: the async front of Layer 2. Concurrent submissions are classified
together in one worker thread, so the event loop never blocks on the encoder."""

from __future__ import annotations

import asyncio
import concurrent.futures

from services.classifier.layer2.classifier import Layer2Classifier
from services.classifier.layer2.predict import Prediction


class MicroBatcher:
    """`await submit(text)`: concurrent submissions are classified in one batch.

    A batch closes when `max_batch` texts are queued or `max_wait_ms` has passed
    since its first text. The encoder runs in one dedicated worker thread, so the
    event loop never blocks and batches never overlap; while a batch runs, new
    submissions queue up and form the next one.
    """

    def __init__(
        self,
        classifier: Layer2Classifier,
        *,
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
    ) -> None:
        self.classifier = classifier
        self.max_batch = max(1, max_batch)
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self._queue: asyncio.Queue[tuple[str, asyncio.Future[Prediction]] | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="layer2-encoder"
        )
        self._closed = False
        self.batches = 0
        self.items = 0
        self.max_batch_seen = 0

    def _ensure_started(self) -> None:
        if self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, text: str) -> Prediction:
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        self._ensure_started()
        assert self._queue is not None
        fut: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((text, fut))
        return await fut

    async def _run(self) -> None:
        assert self._queue is not None
        queue, loop = self._queue, asyncio.get_running_loop()
        stop = False
        while not stop:
            first = await queue.get()
            if first is None:
                break
            batch = [first]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(queue.get(), remaining)
                    except TimeoutError:
                        break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            live = [(t, f) for t, f in batch if not f.done()]
            if not live:
                continue
            texts = [t for t, _ in live]
            try:
                preds = await loop.run_in_executor(
                    self._executor, self.classifier.classify_batch, texts
                )
            except Exception as exc:  # every caller of the batch sees the failure
                for _, f in live:
                    if not f.done():
                        f.set_exception(exc)
                continue
            self.batches += 1
            self.items += len(live)
            self.max_batch_seen = max(self.max_batch_seen, len(live))
            for (_, f), p in zip(live, preds, strict=True):
                if not f.done():
                    f.set_result(p)

    async def maybe_reload(self) -> bool:
        """`classifier.maybe_reload()` on the encoder thread: loading a new head (and a
        fine-tuned encoder, which may need an ONNX export) never blocks the event loop,
        and the swap happens between batches."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.classifier.maybe_reload)

    async def close(self) -> None:
        """Stop accepting; classify everything already submitted; stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and self._queue is not None:
            self._queue.put_nowait(None)
            await self._task
            # Anything queued behind the sentinel (submitted concurrently) is drained too.
            rest = []
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    rest.append(item)
            if rest:
                loop = asyncio.get_running_loop()
                preds = await loop.run_in_executor(
                    self._executor, self.classifier.classify_batch, [t for t, _ in rest]
                )
                for (_, f), p in zip(rest, preds, strict=True):
                    if not f.done():
                        f.set_result(p)
        self._executor.shutdown(wait=True)
