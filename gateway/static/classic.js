// The digits tab: a drawing pad or an uploaded picture, reduced to 8x8 grey levels and sent
// to digits_ensemble over KServe v2 HTTP JSON; the class scores come from digits_onnx.

import { postJSON } from "./api.js";
import { SIZE, toDigit } from "./digits.js";

const $ = (id) => document.getElementById(id);
const NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];

export class Classic {
  constructor() {
    this.pad = $("pad");
    this.ctx = this.pad.getContext("2d", { willReadFrequently: true });
    this.source = "pad"; // what Predict reads: the pad, or the last upload
    this.upload = null; // {rgba, width, height}
    this.seq = 0; // predictions may overlap while drawing: only the latest is shown
    this.clear();
    this.drawing();
    $("pad-clear").addEventListener("click", () => this.clear());
    $("predict").addEventListener("click", () => this.predict());
    $("upload").addEventListener("change", (e) => this.load(e.target.files[0]));
  }

  clear() {
    this.ctx.fillStyle = "#fff";
    this.ctx.fillRect(0, 0, this.pad.width, this.pad.height);
    this.source = "pad";
  }

  // Pointer events cover mouse, pen and touch; strokes are thick, like the data set's.
  drawing() {
    let last = null;
    const at = (e) => {
      const r = this.pad.getBoundingClientRect();
      return [((e.clientX - r.left) * this.pad.width) / r.width, ((e.clientY - r.top) * this.pad.height) / r.height];
    };
    this.pad.addEventListener("pointerdown", (e) => {
      if (this.source !== "pad") this.clear();
      this.pad.setPointerCapture(e.pointerId);
      last = at(e);
      this.stroke(last, last);
    });
    this.pad.addEventListener("pointermove", (e) => {
      if (!last) return;
      const next = at(e);
      this.stroke(last, next);
      last = next;
    });
    const end = () => {
      if (last) this.predict();
      last = null;
    };
    this.pad.addEventListener("pointerup", end);
    this.pad.addEventListener("pointercancel", end);
  }

  stroke([x0, y0], [x1, y1]) {
    const c = this.ctx;
    c.strokeStyle = "#000";
    c.lineWidth = this.pad.width / 7;
    c.lineCap = "round";
    c.lineJoin = "round";
    c.beginPath();
    c.moveTo(x0, y0);
    c.lineTo(x1, y1);
    c.stroke();
  }

  async load(file) {
    if (!file) return;
    const url = URL.createObjectURL(file);
    try {
      const img = new Image();
      img.src = url;
      await img.decode();
      const canvas = document.createElement("canvas");
      [canvas.width, canvas.height] = [img.naturalWidth, img.naturalHeight];
      const c = canvas.getContext("2d", { willReadFrequently: true });
      c.drawImage(img, 0, 0);
      this.upload = { rgba: c.getImageData(0, 0, canvas.width, canvas.height).data, width: canvas.width,
        height: canvas.height };
      // Show it on the pad too, scaled to fit, so the user sees what was read.
      this.clear();
      const s = Math.min(this.pad.width / img.naturalWidth, this.pad.height / img.naturalHeight);
      this.ctx.imageSmoothingEnabled = false;
      this.ctx.drawImage(img, (this.pad.width - s * img.naturalWidth) / 2, (this.pad.height - s * img.naturalHeight) / 2,
        s * img.naturalWidth, s * img.naturalHeight);
      this.source = "upload";
      await this.predict();
    } catch (err) {
      this.show(null, err.message || "the file is not an image this browser can read");
    } finally {
      URL.revokeObjectURL(url);
    }
  }

  // A drawing is framed around its ink; an upload is taken whole, as the data set's
  // pictures were (the digit's box is the image).
  pixels() {
    if (this.source === "upload") return toDigit(this.upload.rgba, this.upload.width, this.upload.height, { fit: false });
    const { width, height } = this.pad;
    return toDigit(this.ctx.getImageData(0, 0, width, height).data, width, height, { fit: true });
  }

  async predict() {
    const seq = ++this.seq;
    const pixels = this.pixels();
    preview(pixels);
    const data = Array.from(pixels);
    let result = null;
    let probs = null;
    try {
      const res = await postJSON("v2/models/digits_ensemble/infer", {
        inputs: [{ name: "IMAGE", datatype: "UINT8", shape: [1, SIZE, SIZE], data }] });
      const out = Object.fromEntries(res.outputs.map((o) => [o.name, o.data]));
      result = { label: String(out.LABEL[0]), score: Number(out.SCORE[0]) };
      probs = await scores(data);
    } catch (err) {
      if (seq === this.seq) this.show(null, err.message);
      return;
    }
    if (seq === this.seq) {
      this.show(result, null);
      bars(probs);
    }
  }

  show(result, error) {
    const digit = result ? NAMES.indexOf(result.label) : -1;
    $("digit-label").textContent = result ? (digit >= 0 ? `${digit} (${result.label})` : result.label) : "–";
    $("digit-label").dataset.label = result ? result.label : "";
    $("digit-score").textContent = result ? `score ${result.score.toFixed(3)}` : "";
    $("digit-error").textContent = error || "";
    $("digit-error").hidden = !error;
    if (!result) $("digit-bars").replaceChildren();
  }
}

// Every class's probability from the classifier inside the ensemble, fed as digits_preprocess
// feeds it (pixels / 255). Optional: a repository without digits_onnx shows the label alone.
async function scores(data) {
  try {
    const res = await postJSON("v2/models/digits_onnx/infer", {
      inputs: [{ name: "input", datatype: "FP32", shape: [1, SIZE * SIZE], data: data.map((v) => v / 255) }],
      outputs: [{ name: "probabilities" }] });
    return res.outputs.find((o) => o.name === "probabilities").data;
  } catch {
    return null;
  }
}

function bars(probs) {
  $("digit-bars").replaceChildren(...(probs || []).map((p, k) => {
    const li = document.createElement("li");
    const name = document.createElement("span");
    name.textContent = `${k}`;
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${Math.round(p * 100)}%`; // CSSOM, which the page's CSP allows
    const value = document.createElement("span");
    value.className = "muted";
    value.textContent = p.toFixed(3);
    li.append(name, bar, value);
    return li;
  }));
}

// The 8x8 that was sent, drawn as the data set is usually shown: ink dark on white.
function preview(pixels) {
  const canvas = $("preview");
  const c = canvas.getContext("2d");
  const img = c.createImageData(SIZE, SIZE);
  pixels.forEach((v, p) => {
    img.data.set([255 - v, 255 - v, 255 - v, 255], 4 * p);
  });
  c.putImageData(img, 0, 0);
}
