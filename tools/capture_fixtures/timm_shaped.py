"""OUR script imitating the console lines of timm's train.py (timm itself is not installed here).

    python timm_shaped.py [--epochs 3] [--batches 23] [--log-interval 5] [--sleep 0.05] [--clock FILE]

The f-strings below are copied from huggingface/pytorch-image-models, train.py at commit
aa4b5850c1543fa488abf260f18390eda46cf85d (2026-08-08): ``train_one_epoch`` lines 1416-1424 (the
``Train:`` line), ``validate`` lines 1519-1525 (the ``Test:`` line), ``main`` line 1219 (``*** Best
metric``) and lines 1102-1104 (``Scheduled epochs``). They are printed the way timm prints them:
``logging`` on the root logger, a StreamHandler (stderr) whose formatter (timm/utils/log.py
``FormatterNoInfo``) prints INFO records as the bare message. The loop around them copies timm's
bookkeeping: ``update_idx`` is 0-based so the last logged index is ``updates_per_epoch - 1``; a line
is logged when ``update_idx % log_interval == 0`` or on the last batch; ``Time:`` is the last
update's wall time (``update_time_m.val``) and the average, the rate is ``update_sample_count /
time`` with the count reset after every update; ``Data:`` is the time spent waiting for the batch.
The model is a Linear(3*32*32, 10) on random 32x32 "images"; ``--sleep`` is added to each update.
Everything else timm prints (model creation, data config, checkpoint saver lines) is left out.
``--clock FILE`` writes ``time.time()`` after each update, one float per line.
"""

import argparse
import logging
import math
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batches", type=int, default=23, help="train batches per epoch")
ap.add_argument("--val-batches", type=int, default=4)
ap.add_argument("--batch-size", type=int, default=16)
ap.add_argument("--log-interval", type=int, default=5)
ap.add_argument("--sleep", type=float, default=0.05)
ap.add_argument("--lr", type=float, default=0.002)
ap.add_argument("--clock", default=None)
args = ap.parse_args()


class FormatterNoInfo(logging.Formatter):  # timm/utils/log.py
    def __init__(self, fmt="%(levelname)s: %(message)s"):
        logging.Formatter.__init__(self, fmt)

    def format(self, record):
        if record.levelno == logging.INFO:
            return str(record.getMessage())
        return logging.Formatter.format(self, record)


h = logging.StreamHandler()
h.setFormatter(FormatterNoInfo())
logging.root.addHandler(h)
logging.root.setLevel(logging.INFO)
_logger = logging.getLogger("train")


class AverageMeter:  # timm/utils/metrics.py
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count if self.count else 0


torch.manual_seed(42)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(0)
train = [(torch.randn(args.batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch_size,), generator=g))
         for _ in range(args.batches)]
val = [(torch.randn(args.batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (args.batch_size,), generator=g))
       for _ in range(args.val_batches)]
clock = open(args.clock, "w") if args.clock else None
updates_per_epoch = len(train)
total_updates = args.epochs * updates_per_epoch


def set_lr(num_updates):  # cosine over all updates (timm's default sched is cosine)
    lr = 0.5 * args.lr * (1 + math.cos(math.pi * num_updates / total_updates))
    for pg in opt.param_groups:
        pg["lr"] = lr


def accuracy(output, target, topk=(1,)):  # timm/utils/metrics.py
    maxk = min(max(topk), output.size()[1])
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    pred = pred.t()
    correct = pred.eq(target.reshape(1, -1).expand_as(pred))
    return [correct[: min(k, maxk)].reshape(-1).float().sum(0) * 100.0 / batch_size for k in topk]


def train_one_epoch(epoch):
    update_time_m, data_time_m, losses_m = AverageMeter(), AverageMeter(), AverageMeter()
    num_updates = epoch * updates_per_epoch
    last_batch_idx = len(train) - 1
    data_start_time = update_start_time = time.time()
    update_sample_count = 0
    for batch_idx, (input, target) in enumerate(train):
        last_batch = batch_idx == last_batch_idx
        update_idx = batch_idx
        data_time_m.update(time.time() - data_start_time)
        loss = loss_fn(model(input), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
        losses_m.update(loss.item(), input.size(0))
        update_sample_count += input.size(0)
        num_updates += 1
        time_now = time.time()
        update_time_m.update(time.time() - update_start_time)
        update_start_time = time_now
        if update_idx % args.log_interval == 0 or last_batch:
            lrl = [param_group["lr"] for param_group in opt.param_groups]
            lr = sum(lrl) / len(lrl)
            loss_avg, loss_now = losses_m.avg, losses_m.val
            _logger.info(
                f'Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} '
                f'({100. * (update_idx + 1) / updates_per_epoch:>3.0f}%)]  '
                f'Loss: {loss_now:#.3g} ({loss_avg:#.3g})  '
                f'Time: {update_time_m.val:.3f}s, {update_sample_count / update_time_m.val:>7.2f}/s  '
                f'({update_time_m.avg:.3f}s, {update_sample_count / update_time_m.avg:>7.2f}/s)  '
                f'LR: {lr:.3e}  '
                f'Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})'
            )
        set_lr(num_updates)
        if clock:
            clock.write(f"{time.time()!r}\n")
            clock.flush()
        update_sample_count = 0
        data_start_time = time.time()


def validate():
    batch_time_m, losses_m, top1_m, top5_m = AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter()
    end = time.time()
    last_idx = len(val) - 1
    with torch.inference_mode():
        for batch_idx, (input, target) in enumerate(val):
            last_batch = batch_idx == last_idx
            output = model(input)
            loss = loss_fn(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses_m.update(loss.item(), output.shape[0])
            top1_m.update(acc1.item(), output.shape[0])
            top5_m.update(acc5.item(), output.shape[0])
            batch_time_m.update(time.time() - end)
            end = time.time()
            if last_batch or batch_idx % args.log_interval == 0:
                log_name = 'Test'
                _logger.info(
                    f'{log_name}: [{batch_idx:>4d}/{last_idx}]  '
                    f'Time: {batch_time_m.val:.3f} ({batch_time_m.avg:.3f})  '
                    f'Loss: {losses_m.val:>7.3f} ({losses_m.avg:>6.3f})  '
                    f'Acc@1: {top1_m.val:>7.3f} ({top1_m.avg:>7.3f})  '
                    f'Acc@5: {top5_m.val:>7.3f} ({top5_m.avg:>7.3f})'
                )
    return top1_m.avg


sched_explain = '(epochs + cooldown_epochs). Warmup within epochs when warmup_prefix=False'
_logger.info(f'Scheduled epochs: {args.epochs} {sched_explain}. LR stepped per update.')
best_metric, best_epoch = None, None
for epoch in range(args.epochs):
    train_one_epoch(epoch)
    top1 = validate()
    if best_metric is None or top1 > best_metric:
        best_metric, best_epoch = top1, epoch
_logger.info('*** Best metric: {0} (epoch {1})'.format(best_metric, best_epoch))  # noqa: UP030, UP032 (timm's line, verbatim)
if clock:
    clock.close()
