package ai.edgepack;

import android.graphics.Bitmap;
import java.nio.ByteBuffer;

/**
 * Camera frames for models compiled with pre-processing ({@code edgepack compile --preprocess}): such a
 * model takes uint8 frames (height x width x channels, row by row) and converts, resizes and normalises
 * them itself. This class fills a frame from an Android {@link Bitmap}; frames from the camera (NV21)
 * go to the model as they are.
 */
public final class Frames {
  private Frames() {}

  /**
   * Bytes per pixel of a frame format.
   *
   * @param format rgb8, bgr8, rgba8 or gray8
   * @return 3, 3, 4 or 1
   * @throws EdgepackException (status {@link EdgepackException#INVALID_ARGUMENT}) for another format
   */
  public static int channels(String format) {
    if ("rgb8".equals(format) || "bgr8".equals(format)) {
      return 3;
    }
    if ("rgba8".equals(format)) {
      return 4;
    }
    if ("gray8".equals(format)) {
      return 1;
    }
    throw new EdgepackException(
        "frames of format " + format + " cannot be made from a Bitmap (rgb8, bgr8, rgba8, gray8 can)",
        EdgepackException.INVALID_ARGUMENT);
  }

  /**
   * Writes the pixels of {@code bitmap} into {@code frame} (from its position, which is not moved) in
   * {@code format}: rgb8, bgr8, rgba8, or gray8 (luma 0.299 R + 0.587 G + 0.114 B, rounded).
   *
   * @param bitmap the picture, exactly {@code width x height} pixels
   * @param format the frame format the model was compiled for
   * @param height the frame height the model was compiled for
   * @param width the frame width the model was compiled for
   * @param frame receives height * width * channels bytes
   * @throws EdgepackException (status {@link EdgepackException#SHAPE}) if the bitmap or the buffer has
   *     another size, ({@link EdgepackException#INVALID_ARGUMENT}) for a format a bitmap cannot give
   */
  public static void fromBitmap(Bitmap bitmap, String format, int height, int width, ByteBuffer frame) {
    int channels = channels(format);
    if (bitmap.getWidth() != width || bitmap.getHeight() != height) {
      throw new EdgepackException(
          "the bitmap is " + bitmap.getWidth() + "x" + bitmap.getHeight() + " (width x height) but the model"
              + " takes " + width + "x" + height + " frames: scale it first (Bitmap.createScaledBitmap), or"
              + " compile the model with --preprocess ...,size=" + bitmap.getHeight() + "x" + bitmap.getWidth(),
          EdgepackException.SHAPE);
    }
    if (frame.remaining() < height * width * channels) {
      throw new EdgepackException(
          "the frame buffer has " + frame.remaining() + " bytes, the frame needs " + height * width * channels,
          EdgepackException.SHAPE);
    }
    int[] row = new int[width];
    int pos = frame.position();
    boolean bgr = "bgr8".equals(format);
    for (int y = 0; y < height; y++) {
      bitmap.getPixels(row, 0, width, 0, y, width, 1);
      for (int x = 0; x < width; x++) {
        int color = row[x];
        int r = (color >> 16) & 0xff;
        int g = (color >> 8) & 0xff;
        int b = color & 0xff;
        if (channels == 1) {
          frame.put(pos++, (byte) ((299 * r + 587 * g + 114 * b + 500) / 1000));
          continue;
        }
        frame.put(pos++, (byte) (bgr ? b : r));
        frame.put(pos++, (byte) g);
        frame.put(pos++, (byte) (bgr ? r : b));
        if (channels == 4) {
          frame.put(pos++, (byte) (color >>> 24));
        }
      }
    }
  }
}
