package android.content.pm;

/** Compile-time stand-in for android.content.pm.ApplicationInfo (the fields edgepack reads). */
public class ApplicationInfo {
  /** Directory of the extracted native libraries. */
  public String nativeLibraryDir;
  /** Path of the base APK. */
  public String sourceDir;
  /** Paths of the split APKs, or null. */
  public String[] splitSourceDirs;
}
