// Pictures to the 8x8 input of digits_ensemble, in scikit-learn's digits convention:
// 0 is background and high values are ink (the data set stores 0..16; the ensemble's
// IMAGE is UINT8 0..255 and digits_preprocess divides by 255). Pure functions on RGBA
// arrays, so they can be checked without a canvas.

export const SIZE = 8;

// Ink per pixel, 0..255: darkness composited over white, so transparent pixels are
// background. When `invert` is set, light strokes on a dark ground are the ink.
export function inkOf(rgba, invert = false) {
  const ink = new Float32Array(rgba.length / 4);
  for (let p = 0; p < ink.length; p++) {
    const lum = 0.299 * rgba[4 * p] + 0.587 * rgba[4 * p + 1] + 0.114 * rgba[4 * p + 2];
    const alpha = rgba[4 * p + 3] / 255;
    ink[p] = invert ? alpha * lum : alpha * (255 - lum);
  }
  return ink;
}

// True when the picture's border is mostly dark: a light digit on a dark ground.
export function darkGround(rgba, width, height) {
  let sum = 0;
  let n = 0;
  const add = (x, y) => {
    const p = 4 * (y * width + x);
    const a = rgba[p + 3] / 255;
    sum += 255 - a * (255 - (0.299 * rgba[p] + 0.587 * rgba[p + 1] + 0.114 * rgba[p + 2]));
    n++;
  };
  for (let x = 0; x < width; x++) {
    add(x, 0);
    add(x, height - 1);
  }
  for (let y = 0; y < height; y++) {
    add(0, y);
    add(width - 1, y);
  }
  return sum / n < 128;
}

// The smallest box holding every pixel with more ink than `threshold`, or null.
export function inkBox(ink, width, height, threshold = 32) {
  let [x0, y0, x1, y1] = [width, height, -1, -1];
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (ink[y * width + x] > threshold) {
        x0 = Math.min(x0, x);
        y0 = Math.min(y0, y);
        x1 = Math.max(x1, x);
        y1 = Math.max(y1, y);
      }
    }
  }
  return x1 < 0 ? null : { x: x0, y: y0, w: x1 - x0 + 1, h: y1 - y0 + 1 };
}

// For each of 8 output cells, the share of every source pixel along one axis that the cell
// [start + k*side/8, start + (k+1)*side/8) covers; pixels outside 0..length-1 count as background.
function coverage(start, side, length) {
  const cells = [];
  for (let k = 0; k < SIZE; k++) {
    const a = start + (k * side) / SIZE;
    const b = start + ((k + 1) * side) / SIZE;
    const parts = [];
    for (let p = Math.max(0, Math.floor(a)); p < Math.min(length, Math.ceil(b)); p++) {
      const w = Math.min(b, p + 1) - Math.max(a, p);
      if (w > 0) parts.push([p, w]);
    }
    cells.push(parts);
  }
  return cells;
}

// Area-averaged 8x8 of the square (x, y, side) of an ink map: each output is the mean ink
// of the source area it covers, as the digits were made (counts over 4x4 blocks).
export function downscale(ink, width, height, square) {
  const cols = coverage(square.x, square.side, width);
  const rows = coverage(square.y, square.side, height);
  const area = (square.side / SIZE) ** 2;
  const out = new Uint8Array(SIZE * SIZE);
  for (let i = 0; i < SIZE; i++) {
    for (let j = 0; j < SIZE; j++) {
      let sum = 0;
      for (const [y, wy] of rows[i]) for (const [x, wx] of cols[j]) sum += ink[y * width + x] * wy * wx;
      out[i * SIZE + j] = Math.max(0, Math.min(255, Math.round(sum / area)));
    }
  }
  return out;
}

// The square to downscale. `fit`: around the ink, as tall as the ink plus a small margin
// (the data set's digits fill their box's height), centred; else the whole picture, padded
// to a square with background.
export function frame(ink, width, height, fit) {
  const box = fit ? inkBox(ink, width, height) : null;
  if (!box) {
    const side = Math.max(width, height);
    return { x: (width - side) / 2, y: (height - side) / 2, side };
  }
  const side = Math.max(box.w, box.h) * 1.05;
  return { x: box.x + box.w / 2 - side / 2, y: box.y + box.h / 2 - side / 2, side };
}

// RGBA pixels -> the 64 UINT8 values of IMAGE, row-major.
export function toDigit(rgba, width, height, { fit }) {
  const ink = inkOf(rgba, darkGround(rgba, width, height));
  return downscale(ink, width, height, frame(ink, width, height, fit));
}
