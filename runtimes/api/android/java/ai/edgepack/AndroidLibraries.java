package ai.edgepack;

import android.content.Context;
import android.content.pm.ApplicationInfo;
import android.os.Build;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

/**
 * Finds the file of a native library that an AAR put into the app ({@code jni/<abi>/} of the AAR,
 * {@code lib/<abi>/} of the APK), so that the runtime can open it by path.
 *
 * <p>When the installer extracted native libraries ({@code extractNativeLibs="true"}) the file is
 * in {@link ApplicationInfo#nativeLibraryDir}. Otherwise (the default for minSdk 23 and newer)
 * the library stays inside the APK and is copied once, per APK version, into
 * {@code getCodeCacheDir()/edgepack/} (Android empties that directory when the app is updated).
 */
public final class AndroidLibraries {
  private AndroidLibraries() {}

  /**
   * Returns a file holding the native library {@code fileName} of this app, for the device's ABI.
   *
   * @param context any context of the app
   * @param fileName the library's file name, e.g. {@code libedgepack_model_mobilenetv2.so}
   * @return an existing, readable file
   * @throws EdgepackException (status {@link EdgepackException#NOT_FOUND}) if the app does not
   *     contain the library for any ABI of the device, or ({@link EdgepackException#IO}) if it
   *     cannot be copied out of the APK
   */
  public static File find(Context context, String fileName) {
    ApplicationInfo info = context.getApplicationInfo();
    if (info.nativeLibraryDir != null) {
      File extracted = new File(info.nativeLibraryDir, fileName);
      if (extracted.isFile()) {
        return extracted;
      }
    }
    List<String> apks = new ArrayList<String>();
    if (info.sourceDir != null) {
      apks.add(info.sourceDir);
    }
    if (info.splitSourceDirs != null) {
      apks.addAll(Arrays.asList(info.splitSourceDirs));
    }
    String[] abis = Build.SUPPORTED_ABIS;
    for (String abi : abis) {
      for (String apk : apks) {
        File found = extract(context, apk, "lib/" + abi + "/" + fileName, fileName);
        if (found != null) {
          return found;
        }
      }
    }
    throw new EdgepackException(
        "the native library "
            + fileName
            + " is neither in "
            + info.nativeLibraryDir
            + " nor in lib/<abi>/ of "
            + apks
            + " for the device ABIs "
            + Arrays.toString(abis)
            + ": add the edgepack AAR (or Gradle module) to the app and build it for one of these"
            + " ABIs",
        EdgepackException.NOT_FOUND);
  }

  private static File extract(Context context, String apk, String entryName, String fileName) {
    ZipFile zip;
    try {
      zip = new ZipFile(apk);
    } catch (IOException e) {
      return null;
    }
    try {
      ZipEntry entry = zip.getEntry(entryName);
      if (entry == null) {
        return null;
      }
      File dir =
          new File(
              new File(context.getCodeCacheDir(), "edgepack"),
              Long.toHexString(entry.getCrc()) + "-" + entry.getSize());
      File target = new File(dir, fileName);
      if (target.isFile() && target.length() == entry.getSize()) {
        return target;
      }
      if (!dir.isDirectory() && !dir.mkdirs() && !dir.isDirectory()) {
        throw new IOException("cannot create " + dir);
      }
      File partial = File.createTempFile(fileName, ".partial", dir);
      InputStream in = zip.getInputStream(entry);
      try {
        OutputStream out = new FileOutputStream(partial);
        try {
          byte[] chunk = new byte[1 << 16];
          int n;
          while ((n = in.read(chunk)) > 0) {
            out.write(chunk, 0, n);
          }
        } finally {
          out.close();
        }
      } finally {
        in.close();
      }
      if (!partial.renameTo(target)) {
        partial.delete();
        if (!target.isFile()) {
          throw new IOException("cannot rename " + partial + " to " + target);
        }
      }
      return target;
    } catch (IOException e) {
      throw new EdgepackException(
          "cannot copy " + entryName + " out of " + apk + ": " + e.getMessage(),
          EdgepackException.IO,
          e);
    } finally {
      try {
        zip.close();
      } catch (IOException ignored) {
        // read-only use
      }
    }
  }
}
