// A task run one at a time: a request while it runs is coalesced into one more run after it
// (two runs overlapped, and the older one's answers could land last). A failed run is
// reported (`failed(error, delayMs)`, which returns whether to retry) and retried after a
// bounded backoff: firstMs after the first failure, doubling up to maxMs; `done()` after a
// run that worked.
export class Serial {
  constructor(task, { done, failed, firstMs = 1000, maxMs = 30_000 }) {
    Object.assign(this, { task, done, failed, firstMs, maxMs });
    this.running = false;
    this.again = false;
    this.delay = 0;
    this.timer = null;
  }

  async request() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.running) { this.again = true; return; }
    this.running = true;
    try {
      do { this.again = false; await this.task(); } while (this.again);
      this.delay = 0;
      this.done();
    } catch (e) {
      this.delay = Math.min(this.delay ? this.delay * 2 : this.firstMs, this.maxMs);
      if (this.failed(e, this.delay)) this.timer = setTimeout(() => this.request(), this.delay);
    } finally {
      this.running = false;
    }
  }

  stop() {
    clearTimeout(this.timer);
    Object.assign(this, { again: false, delay: 0, timer: null });
  }
}
