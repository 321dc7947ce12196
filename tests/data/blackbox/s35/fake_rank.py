# another user's process dressed as a rank: NaN lines, terminal control codes, a very long line
import sys, time
for s in range(1, 40):
    loss = "nan" if s >= 8 else "%.3f" % (3.0 - s * 0.01)
    extra = ""
    if s == 5: extra = " \x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[31mRED\x1b[0m \x1b]8;;http://evil.example/\x07click\x1b]8;;\x07"
    if s == 6: extra = " " + "A" * 200000
    print(f"step={s} loss={loss} lr=0.01{extra}", flush=True)
    time.sleep(0.5)
