package android.graphics;

/**
 * Compile-time stand-in for android.graphics.Bitmap: only the members edgepack's Java layer uses, with
 * the same signatures as the Android SDK. Never packaged: on a device the real class is used. On a host
 * JVM (tests) it holds ARGB pixels made by {@link #createBitmap(int[], int, int, Config)}.
 */
public final class Bitmap {
  /** Pixel configurations (only the one the stand-in makes). */
  public enum Config {
    /** 8 bits per channel, with alpha. */
    ARGB_8888
  }

  private final int[] colors;
  private final int width;
  private final int height;

  private Bitmap(int[] colors, int width, int height) {
    this.colors = colors.clone();
    this.width = width;
    this.height = height;
  }

  /**
   * A bitmap of {@code width x height} ARGB colors, row by row.
   *
   * @param colors the colors, at least width * height of them
   * @param width the width in pixels
   * @param height the height in pixels
   * @param config the pixel configuration
   * @return the bitmap
   */
  public static Bitmap createBitmap(int[] colors, int width, int height, Config config) {
    if (colors.length < width * height) {
      throw new IllegalArgumentException("too few colors");
    }
    return new Bitmap(colors, width, height);
  }

  /** @return the width in pixels */
  public int getWidth() {
    return width;
  }

  /** @return the height in pixels */
  public int getHeight() {
    return height;
  }

  /**
   * Copies ARGB colors of a rectangle into {@code pixels}.
   *
   * @param pixels receives the colors
   * @param offset the first index written in pixels
   * @param stride the distance between rows in pixels
   * @param x the rectangle's left column
   * @param y the rectangle's top row
   * @param w its width
   * @param h its height
   */
  public void getPixels(int[] pixels, int offset, int stride, int x, int y, int w, int h) {
    for (int r = 0; r < h; r++) {
      System.arraycopy(colors, (y + r) * width + x, pixels, offset + r * stride, w);
    }
  }
}
